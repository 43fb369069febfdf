package tokenize

import "sync"

// merge is what a pair of adjacent symbols turns into: the merged token id,
// and the rank deciding which pair merges first (lower first).
type merge struct {
	rank uint32
	id   uint32
}

// pairKey packs two token ids into one map key, so a rank lookup hashes a
// single integer and allocates nothing.
func pairKey(left, right uint32) uint64 { return uint64(left)<<32 | uint64(right) }

// merger applies BPE merges to one pre-tokenized piece of raw bytes.
type merger struct {
	byteID [256]uint32       // initial symbol of every byte
	merges map[uint64]merge  // pairKey(left, right) → merge
	whole  map[string]uint32 // raw bytes → id, for ignore_merges
	// ignoreMerges emits a piece that is itself a vocabulary entry as that
	// one token without running merges (HF's ignore_merges; always on in
	// tiktoken).
	ignoreMerges bool
}

// candidate is a pending merge of the symbol at pos with its right neighbour;
// left and right record the pair it was computed for, so a candidate made
// stale by an earlier merge is recognised and dropped when popped.
type candidate struct {
	rank        uint32
	pos         int32
	left, right uint32
}

func (c candidate) before(d candidate) bool {
	return c.rank < d.rank || (c.rank == d.rank && c.pos < d.pos)
}

// scratch holds the per-call buffers of the merge loop; pooled so that
// encoding allocates nothing in steady state.
type scratch struct {
	ids   []uint32
	next  []int32 // index of the next live symbol, -1 at the end
	prev  []int32 // index of the previous live symbol, -1 at the start
	heap  []candidate
	bytes []byte
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// encode appends the tokens of piece to dst. Merges run lowest rank first,
// leftmost first among equal ranks, exactly like HF's BPE word merge and
// tiktoken's byte-pair merge; a heap keeps long pieces (whitespace runs,
// minified code) at O(n log n).
func (m *merger) encode(piece string, dst []uint32, s *scratch) []uint32 {
	n := len(piece)
	switch {
	case n == 0:
		return dst
	case n == 1:
		return append(dst, m.byteID[piece[0]])
	}
	if m.ignoreMerges {
		if id, ok := m.whole[piece]; ok {
			return append(dst, id)
		}
	}
	s.ids = grow(s.ids, n)
	s.next = grow(s.next, n)
	s.prev = grow(s.prev, n)
	ids, next, prev := s.ids, s.next, s.prev
	for i := 0; i < n; i++ {
		ids[i] = m.byteID[piece[i]]
		next[i] = int32(i + 1)
		prev[i] = int32(i - 1)
	}
	next[n-1] = -1

	h := s.heap[:0]
	for i := 0; i+1 < n; i++ {
		if mg, ok := m.merges[pairKey(ids[i], ids[i+1])]; ok {
			h = append(h, candidate{rank: mg.rank, pos: int32(i), left: ids[i], right: ids[i+1]})
		}
	}
	heapify(h)
	for len(h) > 0 {
		c := h[0]
		h = popHeap(h)
		right := next[c.pos]
		if right < 0 || ids[c.pos] != c.left || ids[right] != c.right {
			continue // merged away or changed by an earlier merge
		}
		ids[c.pos] = m.merges[pairKey(c.left, c.right)].id
		after := next[right]
		next[right] = -1 // dead: candidates still naming it as left are dropped
		next[c.pos] = after
		if after >= 0 {
			prev[after] = c.pos
		}
		if before := prev[c.pos]; before >= 0 {
			if mg, ok := m.merges[pairKey(ids[before], ids[c.pos])]; ok {
				h = pushHeap(h, candidate{rank: mg.rank, pos: before, left: ids[before], right: ids[c.pos]})
			}
		}
		if after >= 0 {
			if mg, ok := m.merges[pairKey(ids[c.pos], ids[after])]; ok {
				h = pushHeap(h, candidate{rank: mg.rank, pos: c.pos, left: ids[c.pos], right: ids[after]})
			}
		}
	}
	s.heap = h
	for i := int32(0); i >= 0; i = next[i] {
		dst = append(dst, ids[i])
	}
	return dst
}

func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n, n+n/4)
	}
	return b[:n]
}

// A small binary min-heap on a slice: container/heap would box every
// candidate in an interface.

func heapify(h []candidate) {
	for i := len(h)/2 - 1; i >= 0; i-- {
		siftDown(h, i)
	}
}

func pushHeap(h []candidate, c candidate) []candidate {
	h = append(h, c)
	i := len(h) - 1
	for i > 0 {
		parent := (i - 1) / 2
		if !h[i].before(h[parent]) {
			break
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
	return h
}

func popHeap(h []candidate) []candidate {
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	siftDown(h, 0)
	return h
}

func siftDown(h []candidate, i int) {
	for {
		least, l, r := i, 2*i+1, 2*i+2
		if l < len(h) && h[l].before(h[least]) {
			least = l
		}
		if r < len(h) && h[r].before(h[least]) {
			least = r
		}
		if least == i {
			return
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
}
