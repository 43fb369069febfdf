package disk

import (
	"fmt"

	"kvtier/chunk"
	"kvtier/tier"
)

// Per-owner quotas (tier.Quota): a record is charged to its scope's owner
// from the moment its space is reserved until it is dropped, and a Put
// whose owner is at its limit evicts the owner's own least recently used
// records first. When they are all pinned or still being written, the Put
// fails with tier.ErrQuota and other owners' records are left alone.

var _ tier.QuotaSetter = (*Tier)(nil)

// SetQuota implements tier.QuotaSetter. Records the tier held before
// (those recovered at start included) are charged to no one.
func (t *Tier) SetQuota(q *tier.Quota) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.idx.quota = q
	t.idx.quotaBusy = t.idx.pinnedNow
}

// quotaRoomLocked evicts key's owner's records until need more bytes fit
// in its quota.
func (t *Tier) quotaRoomLocked(key chunk.Key, need int64) error {
	for {
		o := t.idx.quota.Over(key, need)
		if o == nil {
			return nil
		}
		if need > o.Limit || !t.evictOwnedLocked(o) {
			o.Refuse()
			return fmt.Errorf("disk: put %v: %d bytes for owner %s, whose quota of %d holds %d bytes pinned or being written: %w",
				key, need, o.Name, o.Limit, o.Used(), tier.ErrQuota)
		}
	}
}

// evictOwnedLocked evicts o's least recently used record that is not
// pinned and reports whether there was one.
func (t *Tier) evictOwnedLocked(o *tier.Owner) bool {
	t.idx.now = t.now()
	k, ok := o.Victim(t.idx.quotaBusy)
	if !ok {
		return false
	}
	t.st.Evictions++
	i, _ := t.idx.get(k)
	t.dropLocked(i)
	return true
}

// pinnedNow reports whether k's record is pinned at x.now, without
// noting it as met (victim's business).
func (x *index) pinnedNow(k chunk.Key) bool {
	i, _ := x.get(k)
	return x.slots[i].pinUntil > x.now
}
