package mem

import (
	"fmt"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
)

// Per-owner quotas (tier.Quota): a chunk whose owner is at its limit
// makes room by evicting the owner's own least recently used chunks;
// when all of them are in use, the reservation fails with tier.ErrQuota.

var _ tier.QuotaSetter = (*Tier)(nil)

// SetQuota implements tier.QuotaSetter. Set it before the tier holds
// chunks: those admitted before are charged to no one.
func (t *Tier) SetQuota(q *tier.Quota) {
	t.mu.Lock()
	t.quota = q
	t.mu.Unlock()
}

// ReserveFor is Reserve for a chunk that will be committed under key: when
// key's owner has no room left in its quota, it first evicts the owner's
// own chunks, and fails with a *tier.QuotaError (tier.ErrQuota) when they
// are all in use. The caller counts the refusal (tier.CountQuotaRefusal)
// once it gives up.
func (t *Tier) ReserveFor(key chunk.Key, size int) (arena.ID, []byte, error) {
	if err := t.quotaRoom(key, int64(size)); err != nil {
		return 0, nil, err
	}
	return t.Reserve(size)
}

// quotaRoom evicts key's owner's chunks until size more bytes fit in its
// quota.
func (t *Tier) quotaRoom(key chunk.Key, size int64) error {
	for {
		t.mu.Lock()
		o := t.quota.Over(key, size)
		if o == nil {
			t.mu.Unlock()
			return nil
		}
		if size > o.Limit || !t.evictOwnedLocked(o) {
			used := o.Used()
			t.mu.Unlock()
			return &tier.QuotaError{Owner: o, Err: fmt.Errorf("mem tier: %d bytes for owner %s, whose quota of %d holds %d bytes in use: %w",
				size, o.Name, o.Limit, used, tier.ErrQuota)}
		}
		t.mu.Unlock()
	}
}

// trimQuota evicts the owner's chunks while it is over its limit, which
// reservations that ran concurrently and promotions from lower tiers can
// cause. Chunks in use stay, over the limit, until released.
func (t *Tier) trimQuota(key chunk.Key) {
	if t.quota == nil { // set once, before the tier is used: no lock to read it
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for o := t.quota.Over(key, 0); o != nil && t.evictOwnedLocked(o); o = t.quota.Over(key, 0) {
	}
}

// evictOwnedLocked evicts o's least recently used chunk not in use and
// reports whether there was one. Called with t.mu held; the victim's
// pages are freed at once, since the tier's is its only reference.
func (t *Tier) evictOwnedLocked(o *tier.Owner) bool {
	k, ok := o.Victim(t.busy)
	if !ok {
		return false
	}
	id := t.index[k]
	delete(t.index, k)
	t.policy.Remove(k)
	t.quota.Release(k)
	t.dropped(k)
	t.arena.Unref(id)
	t.evictions.Add(1)
	return true
}

// charge counts a committed chunk against its owner.
func (t *Tier) charge(key chunk.Key, id arena.ID) {
	t.quota.Charge(key, int64(t.arena.Size(id)))
	t.quota.Admit(key)
}
