package replay

import "math"

// belady evicts the cached block whose next reference is furthest in the
// future. Next-use positions are precomputed from the whole trace; a max-heap
// holds one entry per (block, next use) and is invalidated lazily: an entry
// whose next use is no longer the block's current one, or whose block is no
// longer cached, is dropped when it reaches the top.
type belady struct {
	next    []int32 // for each reference, the position of the block's next reference
	depth   []int32
	current []int32 // each cached block's next use
	cached  []bool
	heap    []useEntry
	held    []useEntry // pinned entries popped during one evict
}

// never referenced again
const noNextUse = math.MaxInt32

type useEntry struct {
	next, depth, block int32
}

// after reports whether a should be evicted before b: its next use is
// later, or both are never used again and a is deeper in its prefix chain.
func (a useEntry) after(b useEntry) bool {
	if a.next != b.next {
		return a.next > b.next
	}
	return a.depth > b.depth
}

func newBelady(t *trace) *belady {
	o := &belady{
		next:    make([]int32, len(t.refs)),
		depth:   t.depth,
		current: make([]int32, t.blocks),
		cached:  make([]bool, t.blocks),
	}
	seen := make([]int32, t.blocks)
	for b := range seen {
		seen[b] = noNextUse
	}
	for pos := len(t.refs) - 1; pos >= 0; pos-- {
		b := t.refs[pos]
		o.next[pos] = seen[b]
		seen[b] = int32(pos)
	}
	return o
}

func (o *belady) access(b int32, pos int) {
	o.current[b] = o.next[pos]
	o.push(useEntry{next: o.next[pos], depth: o.depth[pos], block: b})
}

func (o *belady) admit(b int32, pos int) {
	o.cached[b] = true
	o.access(b, pos)
}

func (o *belady) evict(busy func(int32) bool) (int32, bool) {
	defer func() {
		for _, e := range o.held {
			o.push(e)
		}
		o.held = o.held[:0]
	}()
	for len(o.heap) > 0 {
		e := o.pop()
		switch {
		case !o.cached[e.block] || o.current[e.block] != e.next:
			// stale
		case busy(e.block):
			o.held = append(o.held, e)
		default:
			o.cached[e.block] = false
			return e.block, true
		}
	}
	return 0, false
}

func (o *belady) push(e useEntry) {
	o.heap = append(o.heap, e)
	for i := len(o.heap) - 1; i > 0; {
		parent := (i - 1) / 2
		if !o.heap[i].after(o.heap[parent]) {
			break
		}
		o.heap[i], o.heap[parent] = o.heap[parent], o.heap[i]
		i = parent
	}
}

func (o *belady) pop() useEntry {
	top := o.heap[0]
	n := len(o.heap) - 1
	o.heap[0] = o.heap[n]
	o.heap = o.heap[:n]
	for i := 0; ; {
		child := 2*i + 1
		if child >= n {
			break
		}
		if child+1 < n && o.heap[child+1].after(o.heap[child]) {
			child++
		}
		if !o.heap[child].after(o.heap[i]) {
			break
		}
		o.heap[i], o.heap[child] = o.heap[child], o.heap[i]
		i = child
	}
	return top
}
