package policy

import (
	"encoding/binary"
	"hash/maphash"
	"unsafe"

	"kvtier/chunk"
)

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
// The history is a hash table of buckets of ghostWays entries, addressed
// by a 64-bit hash of the key, with room for about treeGhosts evicted keys
// per tracked key. An entry holds the key's hash, not the key: adding a
// ghost writes one bucket and taking one reads one, with no index beside
// it to keep in step. At millions of keys each of those is a cache miss,
// and a map from key to ring position (as the history once was) cost a
// delete and an insert per eviction in a map four times the cache's size.
// The table has room for twice the ghosts it keeps; a ghost older than the
// last limit evictions counts as forgotten (as it would be in a ring of
// that size), and a full bucket drops its oldest. Two keys whose 64-bit hashes agree
// would share a ghost, a chance of about one in 2^64 per pair.
type ghosts[K comparable] struct {
	buckets [][ghostWays]ghost
	mask    uint64
	hash    func(K) uint64
	added   uint32 // ghosts added so far (wrapping), the age of a ghost
	total   int    // ghosts added so far, up to limit: what the table must hold
	limit   uint32 // ghosts kept: the last limit added
}

// ghost is one evicted key: 32 bytes, two to a cache line.
type ghost struct {
	hash     uint64 // 0: empty
	last     uint64 // the key's last use
	gone     uint64 // when it was evicted
	seq      uint32 // g.added when it was added
	hits     uint16
	hadChild bool
	depth    uint8
}

const ghostWays = 4

func newGhosts[K comparable]() ghosts[K] { return ghosts[K]{hash: ghostHash[K]()} }

// ghostHash returns the hash of the history's keys; never 0 (an empty
// entry). The keys kvtier uses (chunk keys in the tiers, block numbers in
// the replay) get a fixed hash, so that runs are reproducible; other key
// types get maphash's, whose seed is random.
func ghostHash[K comparable]() func(K) uint64 {
	switch any(*new(K)).(type) {
	case uint64:
		return func(k K) uint64 { return mix64(*(*uint64)(unsafe.Pointer(&k))) | 1 }
	case chunk.Key:
		return func(k K) uint64 {
			c := (*chunk.Key)(unsafe.Pointer(&k))
			lo, hi := binary.LittleEndian.Uint64(c.Hash[:8]), binary.LittleEndian.Uint64(c.Hash[8:])
			return mix64(lo^mix64(hi^c.Scope)) | 1
		}
	}
	seed := maphash.MakeSeed()
	return func(k K) uint64 { return maphash.Comparable(seed, k) | 1 }
}

// mix64 is SplitMix64's finalizer: every input bit moves every output bit.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// add remembers the evicted node nd under k, keeping the last limit
// ghosts. The table grows with the ghosts it holds, to twice their number
// (a cache that evicts a little pays for a little history), and never
// shrinks.
func (g *ghosts[K]) add(k K, nd *tnode, now uint64, limit int) {
	g.total = min(g.total+1, limit)
	if len(g.buckets)*ghostWays < 2*g.total {
		g.grow(2 * g.total)
	}
	g.limit = uint32(min(limit, 1<<31))
	g.added++
	h := g.hash(k)
	b := &g.buckets[h>>32&g.mask]
	// k has no ghost: it was tracked until now, and admitting a key takes
	// its ghost. The entry goes to an empty way or the oldest one.
	w := 0
	for i := range b {
		if b[i].hash == 0 {
			w = i
			break
		}
		if g.added-b[i].seq > g.added-b[w].seq {
			w = i
		}
	}
	b[w] = ghost{hash: h, last: nd.last, gone: now, seq: g.added, hits: nd.hits, hadChild: nd.hadChild, depth: nd.depth}
}

// grow makes the table a power of two of buckets with room for limit
// ghosts, moving the ghosts it has.
func (g *ghosts[K]) grow(limit int) {
	n := 16
	for n*ghostWays < limit {
		n *= 2
	}
	old := g.buckets
	g.buckets, g.mask = make([][ghostWays]ghost, n), uint64(n-1)
	for i := range old {
		for _, e := range old[i] {
			if e.hash == 0 {
				continue
			}
			b := &g.buckets[e.hash>>32&g.mask]
			for w := range b {
				if b[w].hash == 0 {
					b[w] = e
					break
				}
			}
		}
	}
}

// take forgets and returns the ghost of k, if there is one.
func (g *ghosts[K]) take(k K) (ghost, bool) {
	if len(g.buckets) == 0 {
		return ghost{}, false
	}
	h := g.hash(k)
	b := &g.buckets[h>>32&g.mask]
	for i := range b {
		if b[i].hash == h {
			e := b[i]
			b[i] = ghost{}
			return e, g.added-e.seq < g.limit
		}
	}
	return ghost{}, false
}

// forget drops the ghost of k (the owner removed k: no history is kept).
func (g *ghosts[K]) forget(k K) { g.take(k) }
