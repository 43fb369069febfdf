package policy

import (
	"testing"

	"kvtier/chunk"
)

// TestGhostsRememberTheLastLimit: a ghost comes back with what its key had
// while it is among the last limit evicted, once, and not after; the
// table grows with the limit without losing the ghosts it holds.
func TestGhostsRememberTheLastLimit(t *testing.T) {
	g := newGhosts[uint64]()
	const limit = 1000
	for k := range uint64(3 * limit) {
		g.add(k, &tnode{last: k, hits: uint16(k % 7), hadChild: k%2 == 0}, k+1, limit)
	}
	kept := 0
	for k := range uint64(3 * limit) {
		e, ok := g.take(k)
		switch {
		case ok && k < 2*limit:
			t.Fatalf("key %d, evicted %d evictions ago, is still remembered (limit %d)", k, 3*limit-k, limit)
		case ok && (e.last != k || e.hits != uint16(k%7) || e.hadChild != (k%2 == 0) || e.gone != k+1):
			t.Fatalf("key %d comes back as %+v", k, e)
		case ok:
			kept++
			if _, again := g.take(k); again {
				t.Fatalf("key %d taken twice", k)
			}
		}
	}
	// A bucket that fills drops its oldest early; almost all of the last
	// limit must be there.
	if kept < limit*9/10 {
		t.Fatalf("%d of the last %d evicted keys remembered", kept, limit)
	}
}

// TestGhostHashIsFixed: the keys kvtier uses hash the same in every
// process, so replays are reproducible.
func TestGhostHashIsFixed(t *testing.T) {
	a, b := newGhosts[chunk.Key](), newGhosts[chunk.Key]()
	k := chunk.Key{Scope: 7, Hash: chunk.Hash{1, 2, 3}}
	if a.hash(k) != b.hash(k) || a.hash(k) == 0 {
		t.Fatal("chunk keys hash differently in two histories")
	}
	if x, y := newGhosts[uint64](), newGhosts[uint64](); x.hash(42) != y.hash(42) || x.hash(42) == x.hash(43) {
		t.Fatal("block numbers do not hash to fixed, distinct values")
	}
}
