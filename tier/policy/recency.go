package policy

// recency implements the three single-queue policies. They share one queue
// ordered by insertion and differ only in whether a hit refreshes a key and
// which end Evict takes from:
//
//	LRU:  hits move to the front; evict from the back (least recent).
//	MRU:  hits move to the front; evict from the front (most recent).
//	FIFO: hits change nothing;    evict from the back (oldest insert).
type recency[K comparable] struct {
	name string
	pool pool[K]
	q    queue
}

func newRecency[K comparable](name string) *recency[K] {
	r := &recency[K]{name: name, pool: newPool[K]()}
	r.q = r.pool.newQueue()
	return r
}

func (r *recency[K]) Name() string { return r.name }
func (r *recency[K]) Len() int     { return r.q.len }

func (r *recency[K]) Admit(k K) {
	if _, ok := r.pool.index[k]; ok {
		r.Access(k)
		return
	}
	r.pool.pushFront(&r.q, r.pool.track(k))
}

func (r *recency[K]) Access(k K) {
	if r.name == FIFO {
		return
	}
	if i, ok := r.pool.index[k]; ok {
		r.pool.moveToFront(&r.q, i)
	}
}

func (r *recency[K]) Remove(k K) {
	if i, ok := r.pool.index[k]; ok {
		r.pool.unlink(&r.q, i)
		r.pool.forget(i)
	}
}

func (r *recency[K]) Evict(busy func(K) bool) (K, bool) {
	var i int32
	if r.name == MRU {
		i = r.pool.newestIdle(&r.q, busy)
	} else {
		i = r.pool.oldestIdle(&r.q, busy)
	}
	if i == none {
		var zero K
		return zero, false
	}
	k := r.pool.keys[i]
	r.pool.unlink(&r.q, i)
	r.pool.forget(i)
	return k, true
}
