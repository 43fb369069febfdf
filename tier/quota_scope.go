package tier

import "kvtier/chunk"

// ScopeCharger is a tier keeping quotas (QuotaSetter) that can charge the
// chunks it already holds of a scope to the scope's owner. Quota.Assign
// charges only what the tier admits from then on; the engine calls
// ChargeScope right after it, so that chunks stored before the scope was
// assigned (records the disk tier recovered at a restart, chunks stored
// under raw keys before a client opened the scope) count against the
// owner too, and the tier evicts the owner's own chunks if that takes it
// past its limit.
type ScopeCharger interface {
	ChargeScope(scope uint64)
}

// ChargeHeld charges key, a chunk the tier held before its scope had an
// owner, size bytes, and makes it a candidate for the owner's evictions
// when admit is true (a chunk the tier has made visible; one still being
// written is admitted by the tier's usual Admit when it is). A key
// charged already is left as it is: it was admitted, or will be, by the
// tier's own path. Called under the tier's lock, as Charge.
func (q *Quota) ChargeHeld(key chunk.Key, size int64, admit bool) {
	o := q.Owner(key.Scope)
	if o == nil {
		return
	}
	if _, dup := o.charged[key]; dup {
		return
	}
	o.charged[key] = size
	o.used.Add(size)
	if admit {
		o.order.Admit(key)
	}
}
