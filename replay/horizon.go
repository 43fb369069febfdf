package replay

// Horizon splits Belady's hits at one capacity by how far back their
// block was last used, and measures how predictable the far returns are.
//
// A block's reuse distance at a reference is the number of distinct blocks
// referenced since its previous reference (LRU's stack distance). A hit at
// a distance beyond the capacity is one that no cache gets by recency: it
// must have kept the block while more distinct blocks than it holds went
// by, that is, bet on the block's return. OPT makes every such bet right;
// an online policy can only bet on what it has seen. The classes say how
// good a bet is: at every reference after which its block goes past the
// horizon (its next use is beyond the capacity, or there is none), what
// the policy knew then — how often the block had been used, and whether it
// was its request's last block — and how many of those blocks did come
// back.
type Horizon struct {
	CapacityBlocks int
	OPTHits        int // block references OPT hits
	OPTHitsBeyond  int // of them, at a reuse distance beyond the capacity
	Classes        []HorizonClass
}

// HorizonClass is one kind of decision point past the horizon.
type HorizonClass struct {
	Uses     int  // uses of the block so far, this one included (3: 3 or more)
	Tail     bool // the block was its request's last
	Past     int  // references after which the block went past the horizon
	Returned int  // of them, blocks referenced again later
}

// HorizonOf computes the horizon split of reqs at capacityBlocks.
func HorizonOf(reqs []Request, capacityBlocks int) Horizon {
	t := compile(reqs)
	dist := reuseDistances(t)
	h := Horizon{CapacityBlocks: capacityBlocks}
	t.simulateHits(OPT, newBelady(t), capacityBlocks, func(pos int) {
		h.OPTHits++
		if dist[pos] > capacityBlocks {
			h.OPTHitsBeyond++
		}
	})
	next := make([]int32, len(t.refs))
	seen := make([]int32, t.blocks)
	for b := range seen {
		seen[b] = -1
	}
	for pos := len(t.refs) - 1; pos >= 0; pos-- {
		next[pos], seen[t.refs[pos]] = seen[t.refs[pos]], int32(pos)
	}
	uses := make([]int32, t.blocks)
	var classes [6]HorizonClass
	for r := range t.requests() {
		lo, hi := int(t.starts[r]), int(t.starts[r+1])
		for pos := lo; pos < hi; pos++ {
			b := t.refs[pos]
			uses[b]++
			n := next[pos]
			if n >= 0 && dist[n] <= capacityBlocks {
				continue // comes back within the horizon
			}
			u := int(min(uses[b], 3))
			tail := pos == hi-1
			c := &classes[(u-1)*2+boolInt(tail)]
			c.Uses, c.Tail = u, tail
			c.Past++
			if n >= 0 {
				c.Returned++
			}
		}
	}
	for _, c := range classes {
		if c.Past > 0 {
			h.Classes = append(h.Classes, c)
		}
	}
	return h
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// reuseDistances returns, for every reference, the number of distinct
// blocks referenced since the previous reference of its block (a first
// reference gets the largest int). A Fenwick tree over positions marks
// each block's latest reference; the distance is the marks in between.
func reuseDistances(t *trace) []int {
	n := len(t.refs)
	fw := make([]int32, n+1)
	add := func(i int, v int32) {
		for i++; i <= n; i += i & -i {
			fw[i] += v
		}
	}
	sum := func(i int) int { // marks at positions < i
		s := 0
		for ; i > 0; i -= i & -i {
			s += int(fw[i])
		}
		return s
	}
	last := make([]int32, t.blocks)
	for b := range last {
		last[b] = -1
	}
	dist := make([]int, n)
	for pos, b := range t.refs {
		if p := int(last[b]); p < 0 {
			dist[pos] = int(^uint(0) >> 1)
		} else {
			dist[pos] = sum(pos) - sum(p+1)
			add(p, -1)
		}
		add(pos, 1)
		last[b] = int32(pos)
	}
	return dist
}
