package disk

import (
	"kvtier/chunk"
	"kvtier/tier"
)

var _ tier.ScopeCharger = (*Tier)(nil)

// chargeBatch is how many index slots ChargeScope looks at per hold of the
// tier's lock: a pass over millions of records must not stall Gets and
// Puts for its whole length.
const chargeBatch = 4096

// ChargeScope implements tier.ScopeCharger: one pass over the index, in
// batches of chargeBatch slots under the lock, charges the records of
// scope to its owner (live ones join the owner's eviction order in index
// order; records still being written join it when published), then
// evicts the owner's least recently used unpinned records while it is
// over its limit. A record added between two batches was charged by its
// Put already, and charging is idempotent.
func (t *Tier) ChargeScope(scope uint64) {
	probe := chunk.Key{Scope: scope}
	for start := 0; ; start += chargeBatch {
		t.mu.Lock()
		q := t.idx.quota
		end := min(start+chargeBatch, len(t.idx.slots))
		if q == nil || q.Owner(scope) == nil || t.closed || start >= end {
			t.mu.Unlock()
			return
		}
		for i := start; i < end; i++ {
			s := &t.idx.slots[i]
			if s.key.Scope != scope {
				continue
			}
			if s.state == slotLive || s.state == slotWriting { // a writing one is admitted by publish
				q.ChargeHeld(s.key, recordSize(s.size), s.state == slotLive)
			}
		}
		for {
			o := q.Over(probe, 0)
			if o == nil || !t.evictOwnedLocked(o) {
				break
			}
		}
		t.mu.Unlock()
	}
}
