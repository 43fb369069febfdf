package policy

// tree is the prefix-aware family: it knows each key's parent in its prefix
// chain (the chunk just before it in a prompt, given to AdmitChild) and
// evicts only leaves of the prefix forest, so the cache stays closed under
// prefixes as far as pins allow. A lookup stops at the first missing chunk:
// a chunk whose parent is gone can never be a hit, so evicting a parent
// before its children strands them.
//
// Among the leaves, the victim is the one of lowest rank in a random sample
// of treeSamples leaves (exact ordering would need a heap, and a parent that
// turns into a leaf would enter it somewhere in the middle). The sample
// keeps Evict's cost flat in the number of keys: it reads the leaf array
// only (each entry carries what the rank needs) and in runs of neighbours,
// so a large cache costs a few cache misses per eviction, not one per
// sampled leaf. The generator is seeded, so runs are reproducible.
//
//   - TREELRU ranks leaves by their last use: least recent first. This is
//     the radix-tree eviction of prefix caches in serving engines.
//
//   - TREELFU ranks leaves by last use pushed later by their reuse: each
//     hit on the leaf, up to three, is worth one more pass of the whole
//     cache, in the manner of GreedyDual's frequency credit; a
//     prompt's last chunk never hit, which the next turn of a chat never
//     finds (it diverges there), is worth one pass less.
//
//   - TREESLRU is TREELFU split in two segments, after segmented LRU: a
//     leaf used twice or more is protected while the protected nodes are
//     at most protectedShare of the cache, and ranks eight passes later
//     than its last use, after every probationary leaf in a sample
//     (protected leaves among themselves by last use). The rest rank as
//     in TREELFU. A returning chat's prefix is hit on every turn, so it
//     is protected from the flood of first turns that never return.
//
//   - TREEHD ranks leaves by their expected hit density (hits per unit of
//     cache time still to come), learnt online from the hits of keys and
//     the evictions of leaves by age and class, after Least Hit Density
//     (Beckmann et al., NSDI 2018). See hitDensity.
//
//   - TREERP ranks leaves by last use pushed later by their learned return
//     probability: rpCredit passes of the cache times the probability that
//     a node of the leaf's class (depth in the tree, uses, whether it ever
//     had a child) is used again, learnt online from hits, evictions and
//     returning ghosts. See returnProb.
//
// TREELFU, TREESLRU, TREEHD and TREERP remember recently evicted keys (ghosts): a key that
// comes back resumes its hit count, so chains that keep returning rise.
type tree[K comparable] struct {
	name     string
	keys     []K
	nodes    []tnode
	free     int32
	index    map[K]int32
	leaves   []leaf // every tracked node without tracked children
	n        int
	clock    uint64 // one tick per Admit or Access
	rng      uint64
	learned  bool // TREEHD: rank by hd
	frequent bool // TREELFU, TREESLRU: reuse extends a leaf's life
	segments bool // TREESLRU: a protected segment
	retProb  bool // TREERP: credit by learned return probability
	rp       returnProb
	// protected counts tracked nodes with protectAt hits or more.
	protected int
	hd        hitDensity
	ghosts    ghosts[K]
}

// tnode is one tracked key's place in the forest: its parent, its first
// child and its siblings (so a removed parent can orphan its children), its
// position in the leaf array, and what the rank needs.
type tnode struct {
	parent, child, prev, next int32
	leaf                      int32  // index in tree.leaves, or none
	last                      uint64 // clock at the last admission or hit
	hits                      uint16 // saturating
	hadChild                  bool   // ever had a child: not a prompt's last chunk
	live                      bool
	depth                     uint8 // in the prefix tree, saturating; a root is 0
}

// leaf is one entry of the leaf array: the node and a copy of what its
// rank needs, so that comparing sampled leaves reads the leaf array only.
// The nodes are spread over the whole cache and each one read at random
// is a likely cache miss; at a million keys those misses were most of an
// eviction's cost. Access and addLeaf keep the copy current.
type leaf struct {
	last     uint64
	node     int32
	hits     uint16
	hadChild bool
	depth    uint8
}

// treeSamples is how many leaves Evict compares; treeGhosts, how many
// evicted keys per tracked key the history remembers.
const (
	treeSamples = 32
	treeRun     = 8
	treeGhosts  = 4
	// TREESLRU: hits that protect a node, the protected share of the
	// cache, and how many passes a protected leaf ranks after its last
	// use. Chosen on the traces of docs/bench.md: shares from 0.3 to 1
	// did worse on average.
	protectAt       = 2
	protectedShare  = 0.5
	protectedPasses = 8
)

func newTree[K comparable](name string) *tree[K] {
	t := &tree[K]{name: name, free: none, index: make(map[K]int32), rng: 0x9E3779B97F4A7C15,
		learned: name == TREEHD, frequent: name == TREELFU || name == TREESLRU,
		segments: name == TREESLRU, retProb: name == TREERP,
		ghosts: newGhosts[K]()}
	t.hd.init()
	t.rp.init()
	return t
}

func (t *tree[K]) Name() string { return t.name }
func (t *tree[K]) Len() int     { return t.n }

func (t *tree[K]) Admit(k K) { t.admit(k, none) }

// AdmitChild implements Prefixed.
func (t *tree[K]) AdmitChild(k, parent K) { t.AdmitChildLinked(k, parent) }

// AdmitChildLinked implements Adopter.
func (t *tree[K]) AdmitChildLinked(k, parent K) bool {
	p, ok := t.index[parent]
	if !ok {
		p = none
	}
	return t.admit(k, p) && ok
}

// maxAdoptWalk bounds Adopt's walk up from the parent, which looks for k
// among its ancestors: a longer chain is not adopted.
const maxAdoptWalk = 1 << 16

// Adopt implements Adopter.
func (t *tree[K]) Adopt(k, parent K) bool {
	i, ok := t.index[k]
	p, pok := t.index[parent]
	if !ok || !pok || t.nodes[i].parent != none || p == i {
		return false
	}
	// k can be parent's ancestor only if it has children: a childless
	// k (a chain restored tail first) needs no walk.
	if t.nodes[i].child != none {
		steps := 0
		for q := p; q != none; q = t.nodes[q].parent {
			if q == i || steps == maxAdoptWalk {
				return false
			}
			steps++
		}
	}
	t.link(p, i)
	// The depth of k's own descendants stays as it was: TREERP's classes
	// only saturate at 32, and a wrong class costs a rank, not a link.
	nd := &t.nodes[i]
	nd.depth = t.nodes[p].depth + min(1, ^t.nodes[p].depth)
	if nd.leaf != none {
		t.leaves[nd.leaf].depth = nd.depth
	}
	return true
}

// admit tracks k under parent (none: a root) and reports whether it did;
// a tracked k is accessed instead.
func (t *tree[K]) admit(k K, parent int32) bool {
	if _, ok := t.index[k]; ok {
		t.Access(k)
		return false
	}
	t.clock++
	i := t.alloc(k)
	t.index[k] = i
	t.n++
	t.nodes[i].last = t.clock
	if parent != none {
		t.nodes[i].depth = t.nodes[parent].depth + min(1, ^t.nodes[parent].depth)
	}
	if g, ok := t.ghosts.take(k); ok {
		if t.learned {
			t.hd.returned(g.hits, g.hadChild, g.last, g.gone, t.clock)
		}
		if t.retProb {
			t.rp.returned(&g)
		}
		if parent == none {
			t.nodes[i].depth = g.depth
		}
		t.nodes[i].hits = min(g.hits, ^uint16(0)-1) + 1
		if t.nodes[i].hits >= protectAt {
			t.protected++
		}

	}
	if parent != none {
		t.link(parent, i)
	}
	t.addLeaf(i)
	return true
}

func (t *tree[K]) Access(k K) {
	i, ok := t.index[k]
	if !ok {
		return
	}
	t.clock++
	nd := &t.nodes[i]
	if t.learned {
		t.hd.hit(nd, t.clock)
	}
	if t.retProb {
		t.rp.hit(nd)
	}
	nd.last = t.clock
	if nd.hits < ^uint16(0) {
		nd.hits++
		if nd.hits == protectAt {
			t.protected++
		}
	}
	if nd.leaf != none {
		l := &t.leaves[nd.leaf]
		l.last, l.hits = nd.last, nd.hits
	}
}

func (t *tree[K]) Remove(k K) {
	if i, ok := t.index[k]; ok {
		t.drop(i)
	}
	t.ghosts.forget(k)
}

func (t *tree[K]) Evict(busy func(K) bool) (K, bool) {
	i := t.sampleLeaf(busy)
	if i == none {
		i = t.anyIdle(busy)
	}
	if i == none {
		var zero K
		return zero, false
	}
	k := t.keys[i]
	if t.learned {
		t.hd.evicted(&t.nodes[i], t.clock)
	}
	if t.retProb {
		t.rp.evicted(&t.nodes[i])
	}
	if t.learned || t.frequent || t.retProb {
		t.ghosts.add(k, &t.nodes[i], t.clock, treeGhosts*t.n)
	}
	t.drop(i)
	return k, true
}

// sampleLeaf returns the idle leaf of lowest rank among treeSamples drawn
// at random (among all of them when there are no more), or, when every
// drawn leaf is busy, the first idle leaf found walking from a random
// place; none when no leaf is idle.
func (t *tree[K]) sampleLeaf(busy func(K) bool) int32 {
	n := len(t.leaves)
	if n == 0 {
		return none
	}
	// Rank the sample first and ask the owner about the best leaf only:
	// its busy check is a map lookup that misses the caches as often as
	// the sample does. Only when that leaf is busy (pins are few) is the
	// same sample drawn again, checking every leaf that would be a new
	// best.
	rng := t.rng
	if best := t.bestOfSample(n, nil); busy == nil || !busy(t.keys[best]) {
		return best
	}
	t.rng = rng
	if best := t.bestOfSample(n, busy); best != none {
		return best
	}
	start := t.rand(n)
	for j := range n {
		i := t.leaves[(start+j)%n].node
		if !busy(t.keys[i]) {
			return i
		}
	}
	return none
}

// bestOfSample returns the leaf of lowest rank among treeSamples of the n
// leaves for which busy (may be nil) is false, or none.
//
// The sample is treeSamples/treeRun runs of treeRun neighbours, each from a
// random place: a run shares cache lines, so a large cache costs
// treeSamples/treeRun misses instead of treeSamples. Neighbours in the
// array are not neighbours in age (removals move the last leaf into the
// hole), so the runs lose little of a random sample. The places are drawn
// and the first leaf of every run ranked before the rest: those reads do
// not depend on one another, so the processor has all the runs' misses in
// flight at once instead of one after another.
func (t *tree[K]) bestOfSample(n int, busy func(K) bool) int32 {
	best := none
	var bestRank float64
	if n <= treeSamples { // few leaves: compare them all
		for j := range n {
			l := &t.leaves[j]
			if r := t.rank(l); (best == none || r < bestRank) && (busy == nil || !busy(t.keys[l.node])) {
				best, bestRank = l.node, r
			}
		}
		return best
	}
	const runs = treeSamples / treeRun
	var at [runs]int
	var first [runs]float64
	for r := range at {
		at[r] = t.rand(n)
		first[r] = t.rank(&t.leaves[at[r]])
	}
	for r := range at {
		for m := range treeRun {
			l := &t.leaves[(at[r]+m)%n]
			rk := first[r]
			if m > 0 {
				rk = t.rank(l)
			}
			if (best == none || rk < bestRank) && (busy == nil || !busy(t.keys[l.node])) {
				best, bestRank = l.node, rk
			}
		}
	}
	return best
}

// anyIdle is the last resort when every leaf is busy: some idle inner node
// (whose children are all busy). Evicting it orphans its children. It scans
// every slot, which only pins of whole subtrees make necessary.
func (t *tree[K]) anyIdle(busy func(K) bool) int32 {
	for i := range t.nodes {
		if t.nodes[i].live && (busy == nil || !busy(t.keys[i])) {
			return int32(i)
		}
	}
	return none
}

// rank orders leaves for eviction: lower goes first.
func (t *tree[K]) rank(nd *leaf) float64 {
	if t.learned {
		return t.hd.density(nd.hits, nd.hadChild, nd.last, t.clock)
	}
	if t.retProb {
		// Expected returns, each worth rpCredit passes of the cache.
		return float64(nd.last) + rpCredit*t.rp.p(nd.depth, nd.hits, nd.hadChild)*float64(t.n)
	}
	if t.segments && nd.hits >= protectAt && float64(t.protected) <= protectedShare*float64(t.n) {
		return float64(nd.last) + protectedPasses*float64(t.n)
	}
	if !t.frequent {
		return float64(nd.last)
	}
	// A reuse level is worth one more pass of the whole cache; a prompt's
	// last chunk is worth none.
	f := float64(min(nd.hits, 3))
	if !nd.hadChild && nd.hits == 0 {
		f = -1
	}
	return float64(nd.last) + f*float64(t.n)
}

// rand returns a pseudo-random integer in [0, n) (xorshift64*).
func (t *tree[K]) rand(n int) int {
	t.rng ^= t.rng >> 12
	t.rng ^= t.rng << 25
	t.rng ^= t.rng >> 27
	return int(((t.rng * 2685821657736338717) >> 32) * uint64(n) >> 32)
}

// alloc takes a node for k, reusing a released one when there is any.
func (t *tree[K]) alloc(k K) int32 {
	nd := tnode{parent: none, child: none, prev: none, next: none, leaf: none, live: true}
	if i := t.free; i != none {
		t.free = t.nodes[i].next
		t.keys[i], t.nodes[i] = k, nd
		return i
	}
	t.keys = append(t.keys, k)
	t.nodes = append(t.nodes, nd)
	return int32(len(t.nodes) - 1)
}

// link makes i the newest child of p; p stops being a leaf.
func (t *tree[K]) link(p, i int32) {
	pn := &t.nodes[p]
	if pn.child == none {
		t.removeLeaf(p)
	} else {
		t.nodes[pn.child].prev = i
	}
	t.nodes[i].parent, t.nodes[i].next = p, pn.child
	pn.child = i
	pn.hadChild = true
}

// unlink takes i off its parent's child list; a parent left without
// children becomes a leaf.
func (t *tree[K]) unlink(i int32) {
	nd := &t.nodes[i]
	p := nd.parent
	if p == none {
		return
	}
	if nd.prev != none {
		t.nodes[nd.prev].next = nd.next
	} else {
		t.nodes[p].child = nd.next
	}
	if nd.next != none {
		t.nodes[nd.next].prev = nd.prev
	}
	nd.parent, nd.prev, nd.next = none, none, none
	if t.nodes[p].child == none {
		t.addLeaf(p)
	}
}

// drop stops tracking node i: off its parent, its children orphaned (they
// become roots), off the leaf array, released.
func (t *tree[K]) drop(i int32) {
	t.unlink(i)
	for c := t.nodes[i].child; c != none; {
		next := t.nodes[c].next
		t.nodes[c].parent, t.nodes[c].prev, t.nodes[c].next = none, none, none
		c = next
	}
	t.nodes[i].child = none
	t.removeLeaf(i)
	if t.nodes[i].hits >= protectAt {
		t.protected--
	}
	delete(t.index, t.keys[i])
	var zero K
	t.keys[i] = zero
	t.nodes[i] = tnode{parent: none, child: none, prev: none, next: t.free, leaf: none}
	t.free = i
	t.n--
}

func (t *tree[K]) addLeaf(i int32) {
	nd := &t.nodes[i]
	nd.leaf = int32(len(t.leaves))
	t.leaves = append(t.leaves, leaf{last: nd.last, node: i, hits: nd.hits, hadChild: nd.hadChild, depth: nd.depth})
}

// removeLeaf takes i out of the leaf array by moving the last leaf into
// its place.
func (t *tree[K]) removeLeaf(i int32) {
	pos := t.nodes[i].leaf
	if pos == none {
		return
	}
	last := t.leaves[len(t.leaves)-1]
	t.leaves[pos] = last
	t.nodes[last.node].leaf = pos
	t.leaves = t.leaves[:len(t.leaves)-1]
	t.nodes[i].leaf = none
}
