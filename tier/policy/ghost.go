package policy

// ghosts remembers recently evicted keys of a tree policy: what each had
// when it went (hit count, whether it had a child, its last use). A key
// admitted again while remembered was evicted too early. It comes back
// with its hits plus one, so a chain that keeps returning climbs the
// ranking as it would have had it stayed (frequency-aware admission, in
// the manner of TinyLFU's history but exact for the recent past), and
// TREEHD learns when such keys return: the eviction it counted becomes a
// hit at the age the key would have reached. Without that, a learner only
// ever sees hits younger than the ages the cache already keeps keys to.
//
// The history is a ring of at most treeGhosts times the tracked keys, so old ghosts
// are overwritten and memory stays proportional to the cache.
type ghosts[K comparable] struct {
	ring  []ghost[K]
	next  int // where the next ghost goes once the ring is full
	index map[K]int32
}

type ghost[K comparable] struct {
	key      K
	last     uint64 // the key's last use
	gone     uint64 // when it was evicted
	hits     uint16
	hadChild bool
	live     bool
}

func newGhosts[K comparable]() ghosts[K] { return ghosts[K]{index: make(map[K]int32)} }

// add remembers the evicted node nd under k, keeping at most limit ghosts.
func (g *ghosts[K]) add(k K, nd *tnode, now uint64, limit int) {
	e := ghost[K]{key: k, last: nd.last, gone: now, hits: nd.hits, hadChild: nd.hadChild, live: true}
	// k has no ghost: it was tracked until now, and admitting a key takes
	// its ghost. (No lookup to check: at millions of ghosts each map
	// probe is a cache miss.)
	var i int
	switch {
	case len(g.ring) < max(limit, 16):
		g.ring = append(g.ring, e)
		i = len(g.ring) - 1
	default:
		g.next %= len(g.ring)
		i = g.next
		g.next++
		if o := &g.ring[i]; o.live {
			delete(g.index, o.key)
		}
		g.ring[i] = e
	}
	g.index[k] = int32(i)
}

// take forgets and returns the ghost of k, if there is one.
func (g *ghosts[K]) take(k K) (ghost[K], bool) {
	i, ok := g.index[k]
	if !ok {
		return ghost[K]{}, false
	}
	delete(g.index, k)
	e := g.ring[i]
	g.ring[i].live = false
	return e, true
}

// forget drops the ghost of k (the owner removed k: no history is kept).
func (g *ghosts[K]) forget(k K) { g.take(k) }
