package policy

// returnProb learns, online, the probability that a node of a given class
// is used again: of the nodes of that class, how many were hit (or, once
// evicted, came back while their ghost was remembered) rather than evicted
// for good. A node's class is its depth in the prefix tree (bucketed), its
// use count (0, 1, 2, 3 or more) and whether it ever had a child (a
// prompt's last chunk almost never returns).
//
// Every hit counts a return in the class the node had before it; every
// eviction counts an eviction; a ghost that comes back turns its eviction
// into a return. Every rpPeriod events the table is recomputed and the
// counts decay, so it follows a changing workload.
type returnProb struct {
	counts [rpClasses][2]float32 // returns, evictions
	table  [rpClasses]float32
	events int
}

const (
	rpDepths  = 8
	rpClasses = rpDepths * 4 * 2
	rpPeriod  = 1 << 12
	rpDecay   = 0.9
	// rpPrior is how many events of the seeded probability each class
	// starts with, so a class seen rarely stays near its prior.
	rpPrior = 8
	// rpCredit is how many passes of the cache a certain return is worth
	// in TREERP's rank. Chosen on the traces of docs/bench.md: 4 keeps
	// too little at 2 %, 8 too much at 10 %.
	rpCredit = 6
)

// depthBucket maps a depth to its bucket: 0, 1, 2, 3, 4–7, 8–15, 16–31, 32+.
func depthBucket(d uint8) uint8 {
	switch {
	case d < 4:
		return d
	case d < 8:
		return 4
	case d < 16:
		return 5
	case d < 32:
		return 6
	}
	return 7
}

func rpClass(depth uint8, hits uint16, hadChild bool) int {
	c := int(depthBucket(depth))*8 + int(min(hits, 3))*2
	if hadChild {
		c++
	}
	return c
}

// init seeds the table: more uses, more returns; a last chunk rarely.
func (r *returnProb) init() {
	for c := range rpClasses {
		p := float32(0.2 + 0.15*float32(c/2%4))
		if c%2 == 0 {
			p = 0.02
		}
		r.table[c] = p
		r.counts[c] = [2]float32{rpPrior * p, rpPrior * (1 - p)}
	}
}

func (r *returnProb) p(depth uint8, hits uint16, hadChild bool) float64 {
	return float64(r.table[rpClass(depth, hits, hadChild)])
}

func (r *returnProb) hit(nd *tnode) { r.count(rpClass(nd.depth, nd.hits, nd.hadChild), 0) }

func (r *returnProb) evicted(nd *tnode) { r.count(rpClass(nd.depth, nd.hits, nd.hadChild), 1) }

// returned turns the eviction of a key whose ghost came back into a return.
func (r *returnProb) returned(g *ghost) {
	c := rpClass(g.depth, g.hits, g.hadChild)
	r.counts[c][1] = max(0, r.counts[c][1]-1)
	r.count(c, 0)
}

func (r *returnProb) count(c, what int) {
	r.counts[c][what]++
	if r.events++; r.events >= rpPeriod {
		r.events = 0
		for c := range rpClasses {
			n := r.counts[c][0] + r.counts[c][1]
			if n > 0 {
				r.table[c] = r.counts[c][0] / n
			}
			// Decay, but never below the prior's weight.
			if n > 4*rpPrior {
				r.counts[c][0] *= rpDecay
				r.counts[c][1] *= rpDecay
			}
		}
	}
}
