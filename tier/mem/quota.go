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
		if size > o.Limit { // no eviction can make room: evict nothing
			t.mu.Unlock()
			return &tier.QuotaError{Owner: o, Err: fmt.Errorf("mem tier: a chunk of %d bytes for owner %s is larger than its whole quota of %d bytes: %w",
				size, o.Name, o.Limit, tier.ErrQuota)}
		}
		k, id, ok := t.evictOwnedLocked(o)
		if !ok {
			used := o.Used()
			t.mu.Unlock()
			return &tier.QuotaError{Owner: o, Err: fmt.Errorf("mem tier: %d bytes for owner %s, whose quota of %d holds %d bytes in use: %w",
				size, o.Name, o.Limit, used, tier.ErrQuota)}
		}
		t.mu.Unlock()
		t.evicted(k, id)
	}
}

// TrimQuota evicts the owner's chunks while it is over its limit, which
// reservations that ran concurrently (or in one batch) and promotions from
// lower tiers can cause. Chunks in use stay, over the limit, until
// released: the manager calls it again when a queued write releases one.
func (t *Tier) TrimQuota(key chunk.Key) {
	if t.quota == nil { // set once, before the tier is used: no lock to read it
		return
	}
	for {
		t.mu.Lock()
		o := t.quota.Over(key, 0)
		var k chunk.Key
		var id arena.ID
		ok := false
		if o != nil {
			k, id, ok = t.evictOwnedLocked(o)
		}
		t.mu.Unlock()
		if !ok {
			return
		}
		t.evicted(k, id)
	}
}

// evictOwnedLocked takes o's least recently used chunk not in use out of
// the tier and returns it, for evicted to finish outside the lock; ok is
// false when every chunk of o is in use. Called with t.mu held.
func (t *Tier) evictOwnedLocked(o *tier.Owner) (chunk.Key, arena.ID, bool) {
	k, ok := o.Victim(t.busy)
	if !ok {
		return k, 0, false
	}
	id, _ := t.index.Get(&k)
	t.index.Delete(&k)
	t.policy.Remove(k)
	t.quota.Release(k)
	return k, id, true
}

// evicted reports the victim dropped and frees its pages (the tier's was
// its only reference), as evictOne does for the tier's own victims.
func (t *Tier) evicted(k chunk.Key, id arena.ID) {
	t.dropped(k)
	t.arena.Unref(id)
	t.evictions.Add(1)
}

// charge counts a committed chunk against its owner.
func (t *Tier) charge(key chunk.Key, id arena.ID) {
	t.quota.Charge(key, int64(t.arena.Size(id)))
	t.quota.Admit(key)
}
