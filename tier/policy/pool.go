package policy

import "slices"

// none marks the absence of a slot index.
const none int32 = -1

// slot is the bookkeeping of one node: its neighbours on the queue it sits
// on, plus a counter and a queue tag whose meaning belongs to the policy.
// Indices instead of pointers keep the whole structure invisible to the
// garbage collector's pointer scan.
type slot struct {
	prev, next int32
	count      uint32 // frequency, or another per-policy counter
	queue      uint8  // which of the policy's queues holds the node
}

// pool holds every node of one policy in two parallel slices (keys and
// slots) and maps each tracked key to its index. Released indices form a
// free chain through slot.next and are reused before the slices grow, so a
// policy in steady state does not allocate.
//
// Queues are circular doubly linked lists threaded through the slots, each
// with its own sentinel slot (whose key is the zero K and which is never in
// the index). sentinel.next is the newest node, sentinel.prev the oldest.
type pool[K comparable] struct {
	keys  []K
	slots []slot
	free  int32
	index map[K]int32
}

func newPool[K comparable]() pool[K] {
	return pool[K]{free: none, index: make(map[K]int32)}
}

// queue is one list of nodes: its sentinel slot and its length.
type queue struct {
	sentinel int32
	len      int
}

// alloc takes a slot for k, reusing a released one when there is any. It
// does not touch the index.
func (p *pool[K]) alloc(k K) int32 {
	if i := p.free; i != none {
		p.free = p.slots[i].next
		p.keys[i] = k
		p.slots[i] = slot{prev: none, next: none}
		return i
	}
	p.keys = append(p.keys, k)
	p.slots = append(p.slots, slot{prev: none, next: none})
	return int32(len(p.slots) - 1)
}

// release returns slot i to the free chain. The caller has unlinked it.
func (p *pool[K]) release(i int32) {
	var zero K
	p.keys[i] = zero
	p.slots[i] = slot{prev: none, next: p.free}
	p.free = i
}

// track allocates a slot for k and records it in the index.
func (p *pool[K]) track(k K) int32 {
	i := p.alloc(k)
	p.index[k] = i
	return i
}

// forget removes slot i from the index and releases it. The caller has
// unlinked it.
func (p *pool[K]) forget(i int32) {
	delete(p.index, p.keys[i])
	p.release(i)
}

// newQueue allocates an empty queue: a sentinel slot linked to itself.
func (p *pool[K]) newQueue() queue {
	s := p.alloc(*new(K))
	p.slots[s].prev, p.slots[s].next = s, s
	return queue{sentinel: s}
}

// pushFront links slot i as the newest node of q.
func (p *pool[K]) pushFront(q *queue, i int32) {
	s := q.sentinel
	first := p.slots[s].next
	p.slots[i].prev, p.slots[i].next = s, first
	p.slots[first].prev = i
	p.slots[s].next = i
	q.len++
}

// unlink takes slot i off q.
func (p *pool[K]) unlink(q *queue, i int32) {
	prev, next := p.slots[i].prev, p.slots[i].next
	p.slots[prev].next = next
	p.slots[next].prev = prev
	p.slots[i].prev, p.slots[i].next = none, none
	q.len--
}

// moveToFront makes slot i, already on q, the newest node of q.
func (p *pool[K]) moveToFront(q *queue, i int32) {
	if p.slots[q.sentinel].next == i {
		return
	}
	p.unlink(q, i)
	p.pushFront(q, i)
}

// moveTo transfers slot i from one queue to the front of another and tags
// it with the destination's queue id.
func (p *pool[K]) moveTo(from, to *queue, toID uint8, i int32) {
	p.unlink(from, i)
	p.pushFront(to, i)
	p.slots[i].queue = toID
}

// oldest returns the oldest node of q, or none when q is empty.
func (p *pool[K]) oldest(q *queue) int32 {
	if i := p.slots[q.sentinel].prev; i != q.sentinel {
		return i
	}
	return none
}

// newer returns the node just newer than i on q, or none at the front.
func (p *pool[K]) newer(q *queue, i int32) int32 {
	if n := p.slots[i].prev; n != q.sentinel {
		return n
	}
	return none
}

// older returns the node just older than i on q, or none at the back.
func (p *pool[K]) older(q *queue, i int32) int32 {
	if n := p.slots[i].next; n != q.sentinel {
		return n
	}
	return none
}

// newest returns the newest node of q, or none when q is empty.
func (p *pool[K]) newest(q *queue) int32 {
	if i := p.slots[q.sentinel].next; i != q.sentinel {
		return i
	}
	return none
}

// oldestIdle walks q from its oldest node towards its newest and returns the
// first node whose key is not busy, or none. Busy nodes stay where they are.
func (p *pool[K]) oldestIdle(q *queue, busy func(K) bool) int32 {
	for i := p.oldest(q); i != none; i = p.newer(q, i) {
		if busy == nil || !busy(p.keys[i]) {
			return i
		}
	}
	return none
}

// newestIdle is oldestIdle walking from the newest node.
func (p *pool[K]) newestIdle(q *queue, busy func(K) bool) int32 {
	for i := p.newest(q); i != none; i = p.older(q, i) {
		if busy == nil || !busy(p.keys[i]) {
			return i
		}
	}
	return none
}

// grow makes room for n more nodes (see Grower).
func (p *pool[K]) grow(n int) {
	if len(p.index) == 0 {
		p.index = make(map[K]int32, n)
	}
	p.keys = slices.Grow(p.keys, n)
	p.slots = slices.Grow(p.slots, n)
}
