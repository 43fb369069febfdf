package policy

// arc is the Adaptive Replacement Cache (Megiddo and Modha, FAST 2003).
//
// Resident keys live in T1 (seen once recently) or T2 (seen at least twice);
// B1 and B2 remember keys recently evicted from T1 and T2. The target size p
// of T1 adapts: a key admitted again while in B1 says T1 was too small and
// grows p; one found in B2 shrinks it. Evict takes the least recent key of
// T1 when T1 is above its target, otherwise of T2.
//
// The cache size c of the paper is the number of resident keys when the
// owner last began evicting (it evicts when full, so that is its capacity
// in objects; a burst of evictions for one large object does not shrink
// it). The ghost lists are trimmed to the paper's bounds
// |T1|+|B1| <= c and |T1|+|T2|+|B1|+|B2| <= 2c. Because Evict runs before
// Admit, it cannot see whether the incoming key is in B2, so the paper's
// tie rule (evict from T1 when |T1| = p and the key is in B2) is dropped.
type arc[K comparable] struct {
	pool           pool[K]
	t1, t2, b1, b2 queue
	p              int  // target length of T1
	c              int  // cache size in keys, learnt at Evict
	evicting       bool // the last call was Evict: c is already learnt
}

const (
	arcT1 uint8 = iota
	arcT2
	arcB1
	arcB2
)

func newARC[K comparable]() *arc[K] {
	a := &arc[K]{pool: newPool[K]()}
	a.t1 = a.pool.newQueue()
	a.t2 = a.pool.newQueue()
	a.b1 = a.pool.newQueue()
	a.b2 = a.pool.newQueue()
	return a
}

func (a *arc[K]) Name() string { return ARC }
func (a *arc[K]) Len() int     { return a.t1.len + a.t2.len }

func (a *arc[K]) Admit(k K) {
	a.evicting = false
	i, ok := a.pool.index[k]
	if !ok {
		i = a.pool.track(k)
		a.pool.slots[i].queue = arcT1
		a.pool.pushFront(&a.t1, i)
		a.trimGhosts()
		return
	}
	switch a.pool.slots[i].queue {
	case arcB1:
		a.p = min(a.p+max(1, a.b2.len/a.b1.len), a.size())
		a.pool.moveTo(&a.b1, &a.t2, arcT2, i)
	case arcB2:
		a.p = max(a.p-max(1, a.b1.len/a.b2.len), 0)
		a.pool.moveTo(&a.b2, &a.t2, arcT2, i)
	default:
		a.Access(k)
		return
	}
	a.trimGhosts()
}

func (a *arc[K]) Access(k K) {
	i, ok := a.pool.index[k]
	if !ok {
		return
	}
	switch a.pool.slots[i].queue {
	case arcT1:
		a.pool.moveTo(&a.t1, &a.t2, arcT2, i)
	case arcT2:
		a.pool.moveToFront(&a.t2, i)
	}
}

func (a *arc[K]) Remove(k K) {
	if i, ok := a.pool.index[k]; ok {
		a.pool.unlink(a.queueOf(a.pool.slots[i].queue), i)
		a.pool.forget(i)
	}
}

func (a *arc[K]) Evict(busy func(K) bool) (K, bool) {
	if !a.evicting {
		a.c, a.evicting = a.Len(), true
		a.p = min(a.p, a.c)
	}
	first, second := arcT2, arcT1
	if a.t1.len > 0 && a.t1.len > a.p {
		first, second = arcT1, arcT2
	}
	for _, from := range [2]uint8{first, second} {
		q := a.queueOf(from)
		if i := a.pool.oldestIdle(q, busy); i != none {
			k := a.pool.keys[i]
			if from == arcT1 {
				a.pool.moveTo(q, &a.b1, arcB1, i)
			} else {
				a.pool.moveTo(q, &a.b2, arcB2, i)
			}
			a.trimGhosts()
			return k, true
		}
	}
	var zero K
	return zero, false
}

// size is the cache size c used for the bounds: what the last Evict saw,
// or more while the owner is still filling up.
func (a *arc[K]) size() int { return max(a.c, a.Len()) }

// trimGhosts drops the oldest ghost keys beyond ARC's directory bounds.
func (a *arc[K]) trimGhosts() {
	c := a.size()
	for a.b1.len > 0 && a.t1.len+a.b1.len > c {
		a.dropOldest(&a.b1)
	}
	for a.b2.len > 0 && a.Len()+a.b1.len+a.b2.len > 2*c {
		a.dropOldest(&a.b2)
	}
}

func (a *arc[K]) dropOldest(q *queue) {
	i := a.pool.oldest(q)
	a.pool.unlink(q, i)
	a.pool.forget(i)
}

func (a *arc[K]) queueOf(id uint8) *queue {
	switch id {
	case arcT1:
		return &a.t1
	case arcT2:
		return &a.t2
	case arcB1:
		return &a.b1
	}
	return &a.b2
}
