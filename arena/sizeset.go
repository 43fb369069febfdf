package arena

import "math/bits"

// sizeSet is a set of small non-negative integers with a fast "smallest
// member ≥ i" query. It is a tree of 64-bit words: a bit in level k+1 is set
// when the word it stands for in level k is non-zero, so every operation
// touches one word per level — four levels cover 16M members.
//
// The allocator keeps the run lengths that have a non-empty free list here,
// which turns best-fit into one successor query.
type sizeSet struct {
	levels [][]uint64 // levels[0] holds the members; the last level is one word
}

func newSizeSet(n int) sizeSet {
	var s sizeSet
	for {
		words := (n + 63) / 64
		s.levels = append(s.levels, make([]uint64, words))
		if words <= 1 {
			return s
		}
		n = words
	}
}

func (s *sizeSet) add(i int) {
	for _, level := range s.levels {
		w := i >> 6
		before := level[w]
		level[w] |= 1 << (i & 63)
		if before != 0 {
			return // the parent bit is already set
		}
		i = w
	}
}

func (s *sizeSet) remove(i int) {
	for _, level := range s.levels {
		w := i >> 6
		level[w] &^= 1 << (i & 63)
		if level[w] != 0 {
			return // the word still has members, so the parent bit stays
		}
		i = w
	}
}

// next returns the smallest member ≥ i, or -1 when there is none.
func (s *sizeSet) next(i int) int {
	level := 0
	for {
		if level == len(s.levels) {
			return -1
		}
		w := i >> 6
		if w >= len(s.levels[level]) {
			return -1
		}
		if rest := s.levels[level][w] & (^uint64(0) << (i & 63)); rest != 0 {
			i = w<<6 | bits.TrailingZeros64(rest)
			break
		}
		// Nothing left in this word: look for the next non-empty word
		// one level up.
		i = w + 1
		level++
	}
	for level > 0 {
		level--
		i = i<<6 | bits.TrailingZeros64(s.levels[level][i])
	}
	return i
}

// max returns the largest member, or -1 when the set is empty.
func (s *sizeSet) max() int {
	top := len(s.levels) - 1
	if s.levels[top][0] == 0 {
		return -1
	}
	i := 0
	for level := top; level >= 0; level-- {
		i = i<<6 | (63 - bits.LeadingZeros64(s.levels[level][i]))
	}
	return i
}
