package mem

import (
	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
)

var _ tier.ScopeCharger = (*Tier)(nil)

// ChargeScope implements tier.ScopeCharger: it charges the chunks of
// scope the tier holds to the scope's owner, then evicts the owner's
// least recently used chunks not in use while it is over its limit
// (TrimQuota). The index (keyindex.go) cannot be left and resumed mid-pass,
// so the pass holds the lock for one scan of it; evictions run outside.
func (t *Tier) ChargeScope(scope uint64) {
	if t.quota == nil || t.quota.Owner(scope) == nil {
		return
	}
	t.mu.Lock()
	n := 0
	t.index.Range(func(k chunk.Key, id arena.ID) bool {
		if k.Scope == scope {
			t.quota.ChargeHeld(k, int64(t.arena.Size(id)), true)
			n++
		}
		return true
	})
	t.mu.Unlock()
	if n > 0 {
		t.TrimQuota(chunk.Key{Scope: scope})
	}
}
