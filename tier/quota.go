package tier

import (
	"errors"
	"sync"
	"sync/atomic"

	"kvtier/chunk"
	"kvtier/tier/policy"
)

// ErrQuota is returned when a chunk's owner is at its quota in a tier and
// none of its own chunks there can be evicted to make room.
var ErrQuota = errors.New("tier: the owner's quota is full of chunks in use")

// Quota is per-owner byte accounting for one tier (the daemon's tenants,
// docs/security.md#tenants). Owners are named and given a limit up front;
// scopes are assigned to owners as the daemon learns them. A chunk of an
// assigned scope is charged to its owner while the tier holds it, and the
// tier keeps, per owner, a second eviction order (LRU) of the owner's
// chunks only: an owner at its limit makes room by evicting its own least
// recently used chunks, never another owner's, in O(1) per chunk.
//
// A tier takes a Quota with SetQuota (QuotaSetter) and calls its
// accounting methods (Charge, Admit, Access, Release, Victim) under its
// own lock, which also guards the owners' orders and charges. A nil
// *Quota accounts nothing.
type Quota struct {
	owners []*Owner

	mu     sync.RWMutex // guards scopes
	scopes map[uint64]*Owner
}

// Owner is one owner's account in a tier.
type Owner struct {
	Name  string
	Limit int64 // bytes; 0 is no limit

	used      atomic.Int64
	evictions atomic.Uint64
	refused   atomic.Uint64

	// Guarded by the tier's lock.
	order   policy.Policy[chunk.Key] // the owner's admitted chunks, LRU
	charged map[chunk.Key]int64      // what each held chunk was charged
}

// QuotaStats is a snapshot of one owner's account.
type QuotaStats struct {
	Owner     string
	Limit     int64  // bytes, 0 for none
	Used      int64  // bytes charged now
	Evictions uint64 // chunks evicted to keep the owner within its limit
	Refused   uint64 // chunks refused because the limit was full of chunks in use
}

// QuotaSetter is implemented by tiers that account bytes per owner.
type QuotaSetter interface {
	SetQuota(*Quota)
}

// NewQuota returns the accounts of owners with limits[i] bytes each
// (0: the owner is accounted but not limited).
func NewQuota(names []string, limits []int64) *Quota {
	q := &Quota{scopes: make(map[uint64]*Owner)}
	for i, n := range names {
		lru, _ := policy.New[chunk.Key](policy.LRU) // a known name: never fails
		q.owners = append(q.owners, &Owner{Name: n, Limit: limits[i],
			order: lru, charged: make(map[chunk.Key]int64)})
	}
	return q
}

// Assign charges scope's chunks to the owner named owner from now on.
// Chunks the tier admitted before stay uncharged. An unknown owner is
// ignored.
func (q *Quota) Assign(scope uint64, owner string) {
	if q == nil {
		return
	}
	for _, o := range q.owners {
		if o.Name != owner {
			continue
		}
		q.mu.Lock()
		q.scopes[scope] = o
		q.mu.Unlock()
		return
	}
}

// Assigned reports whether scope has an owner.
func (q *Quota) Assigned(scope uint64) bool { return q.Owner(scope) != nil }

// Owner returns the owner of scope, or nil.
func (q *Quota) Owner(scope uint64) *Owner {
	if q == nil {
		return nil
	}
	q.mu.RLock()
	o := q.scopes[scope]
	q.mu.RUnlock()
	return o
}

// Stats returns every owner's account, in the order of NewQuota.
func (q *Quota) Stats() []QuotaStats {
	if q == nil {
		return nil
	}
	out := make([]QuotaStats, len(q.owners))
	for i, o := range q.owners {
		out[i] = QuotaStats{Owner: o.Name, Limit: o.Limit, Used: o.used.Load(),
			Evictions: o.evictions.Load(), Refused: o.refused.Load()}
	}
	return out
}

// Over returns the owner of key when adding size bytes would take it past
// its limit, and nil when the chunk fits (or has no limited owner).
func (q *Quota) Over(key chunk.Key, size int64) *Owner {
	o := q.Owner(key.Scope)
	if o == nil || o.Limit == 0 || o.used.Load()+size <= o.Limit {
		return nil
	}
	return o
}

// Charge counts size bytes of key against its owner, if it has one. A
// key charged already is not charged twice.
func (q *Quota) Charge(key chunk.Key, size int64) {
	o := q.Owner(key.Scope)
	if o == nil {
		return
	}
	if _, dup := o.charged[key]; dup {
		return
	}
	o.charged[key] = size
	o.used.Add(size)
}

// Admit makes a charged key a candidate for its owner's evictions.
func (q *Quota) Admit(key chunk.Key) {
	if o := q.Owner(key.Scope); o != nil {
		if _, ok := o.charged[key]; ok {
			o.order.Admit(key)
		}
	}
}

// Access records a hit on key in its owner's order.
func (q *Quota) Access(key chunk.Key) {
	if o := q.Owner(key.Scope); o != nil {
		o.order.Access(key)
	}
}

// Release gives back what key was charged, when the tier drops it for
// any reason.
func (q *Quota) Release(key chunk.Key) {
	o := q.Owner(key.Scope)
	if o == nil {
		return
	}
	size, ok := o.charged[key]
	if !ok {
		return
	}
	delete(o.charged, key)
	o.order.Remove(key)
	o.used.Add(-size)
}

// Victim takes the owner's least recently used chunk for which busy is
// false out of its order and returns it; the tier then drops it and calls
// Release. ok is false when every chunk of the owner is busy.
func (o *Owner) Victim(busy func(chunk.Key) bool) (chunk.Key, bool) {
	k, ok := o.order.Evict(busy)
	if ok {
		o.evictions.Add(1)
	}
	return k, ok
}

// Refuse counts a chunk refused for want of room in the owner's quota.
func (o *Owner) Refuse() { o.refused.Add(1) }

// QuotaError is a reservation refused by its owner's quota. It wraps
// ErrQuota. The tier does not count it: the caller, which may wait and
// try again, counts the final refusal with CountQuotaRefusal.
type QuotaError struct {
	Owner *Owner
	Err   error // the tier's message, wrapping ErrQuota
}

func (e *QuotaError) Error() string { return e.Err.Error() }
func (e *QuotaError) Unwrap() error { return e.Err }

// CountQuotaRefusal counts err against its owner when it is a QuotaError.
func CountQuotaRefusal(err error) {
	if err == nil {
		return // before errors.As, whose target escapes: no allocation per chunk
	}
	var qe *QuotaError
	if errors.As(err, &qe) {
		qe.Owner.Refuse()
	}
}

// Used returns the bytes charged to the owner now.
func (o *Owner) Used() int64 { return o.used.Load() }
