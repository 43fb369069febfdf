package policy

import "math"

// lfu evicts the key with the fewest hits since admission, breaking ties by
// recency (the least recently touched of the least frequent goes first).
//
// It is the constant-time scheme of frequency buckets: a chain of buckets in
// ascending frequency, one per frequency some key currently has, each
// holding a recency queue of its keys. A hit moves a key from its bucket to
// the front of the next one (creating it when the next frequency is absent);
// Evict takes from the back of the lowest bucket. Frequencies saturate at
// the largest uint32 instead of wrapping.
type lfu[K comparable] struct {
	pool    pool[K] // slot.count holds the index of the key's bucket
	buckets []bucket
	free    int32 // free chain of buckets through bucket.next
	n       int
}

// bucket groups the keys of one frequency. Bucket 0 is the sentinel of the
// circular bucket chain; a released bucket keeps its (empty) item queue so
// reusing it allocates nothing.
type bucket struct {
	prev, next int32
	freq       uint32
	items      queue
}

func newLFU[K comparable]() *lfu[K] {
	l := &lfu[K]{pool: newPool[K](), free: none}
	l.buckets = []bucket{{prev: 0, next: 0}}
	return l
}

func (l *lfu[K]) Name() string { return LFU }
func (l *lfu[K]) Len() int     { return l.n }

func (l *lfu[K]) Admit(k K) {
	if _, ok := l.pool.index[k]; ok {
		l.Access(k)
		return
	}
	first := l.buckets[0].next
	if first == 0 || l.buckets[first].freq != 1 {
		first = l.insertBucketAfter(0, 1)
	}
	i := l.pool.track(k)
	l.pool.slots[i].count = uint32(first)
	l.pool.pushFront(&l.buckets[first].items, i)
	l.n++
}

func (l *lfu[K]) Access(k K) {
	i, ok := l.pool.index[k]
	if !ok {
		return
	}
	b := int32(l.pool.slots[i].count)
	f := l.buckets[b].freq
	if f == math.MaxUint32 {
		l.pool.moveToFront(&l.buckets[b].items, i)
		return
	}
	next := l.buckets[b].next
	if next == 0 || l.buckets[next].freq != f+1 {
		next = l.insertBucketAfter(b, f+1) // may grow l.buckets: index again below
	}
	l.pool.unlink(&l.buckets[b].items, i)
	l.pool.pushFront(&l.buckets[next].items, i)
	l.pool.slots[i].count = uint32(next)
	l.dropIfEmpty(b)
}

func (l *lfu[K]) Remove(k K) {
	if i, ok := l.pool.index[k]; ok {
		l.drop(i)
	}
}

func (l *lfu[K]) Evict(busy func(K) bool) (K, bool) {
	for b := l.buckets[0].next; b != 0; b = l.buckets[b].next {
		if i := l.pool.oldestIdle(&l.buckets[b].items, busy); i != none {
			k := l.pool.keys[i]
			l.drop(i)
			return k, true
		}
	}
	var zero K
	return zero, false
}

// drop stops tracking the key in slot i.
func (l *lfu[K]) drop(i int32) {
	b := int32(l.pool.slots[i].count)
	l.pool.unlink(&l.buckets[b].items, i)
	l.pool.forget(i)
	l.dropIfEmpty(b)
	l.n--
}

// insertBucketAfter links a bucket for freq into the chain after bucket
// after and returns its index.
func (l *lfu[K]) insertBucketAfter(after int32, freq uint32) int32 {
	var b int32
	if l.free != none {
		b = l.free
		l.free = l.buckets[b].next
	} else {
		items := l.pool.newQueue()
		l.buckets = append(l.buckets, bucket{items: items})
		b = int32(len(l.buckets) - 1)
	}
	next := l.buckets[after].next
	l.buckets[b].prev, l.buckets[b].next, l.buckets[b].freq = after, next, freq
	l.buckets[after].next = b
	l.buckets[next].prev = b
	return b
}

// dropIfEmpty unlinks bucket b from the chain when it holds no keys.
func (l *lfu[K]) dropIfEmpty(b int32) {
	if l.buckets[b].items.len > 0 {
		return
	}
	prev, next := l.buckets[b].prev, l.buckets[b].next
	l.buckets[prev].next = next
	l.buckets[next].prev = prev
	l.buckets[b].prev, l.buckets[b].next = none, l.free
	l.free = b
}
