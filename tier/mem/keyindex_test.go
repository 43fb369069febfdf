package mem

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/internal/proccpu"
)

// ikey is a key from a small space (so that deletes and re-inserts of the
// same keys happen), spread over a few scopes.
func ikey(i uint64) chunk.Key {
	var h chunk.Hash
	binary.LittleEndian.PutUint64(h[:], i*0x9e3779b97f4a7c15)
	binary.LittleEndian.PutUint64(h[8:], i)
	return chunk.Key{Scope: i % 3, Hash: h}
}

// checkIndex compares ix with want and checks its structure: every key at
// its recorded distance from its home, no run broken by a key that a
// lookup would stop before, counts and directory consistent.
func checkIndex(t *testing.T, ix *keyIndex, want map[chunk.Key]arena.ID) {
	t.Helper()
	if ix.Len() != len(want) {
		t.Fatalf("Len %d, want %d", ix.Len(), len(want))
	}
	for k, id := range want {
		if got, ok := ix.Get(&k); !ok || got != id {
			t.Fatalf("Get(%v) = %v, %v; want %v", k, got, ok, id)
		}
	}
	seen := 0
	ix.Range(func(k chunk.Key, id arena.ID) bool {
		if w, ok := want[k]; !ok || w != id {
			t.Fatalf("Range yields %v=%v, map has %v (%v)", k, id, w, ok)
		}
		seen++
		return true
	})
	if seen != len(want) {
		t.Fatalf("Range yields %d keys, want %d", seen, len(want))
	}
	if len(ix.dir) != 1<<ix.depth {
		t.Fatalf("directory of %d entries at depth %d", len(ix.dir), ix.depth)
	}
	total := 0
	for j := 0; j < len(ix.dir); {
		s := ix.dir[j]
		span := 1 << (ix.depth - s.depth)
		if j%span != 0 {
			t.Fatalf("segment of depth %d at directory entry %d", s.depth, j)
		}
		for x := j; x < j+span; x++ {
			if ix.dir[x] != s {
				t.Fatalf("directory entry %d does not point at the segment of entries %d..%d", x, j, j+span)
			}
		}
		n := 0
		for i, c := range s.ctrl {
			if c == 0 {
				continue
			}
			n++
			h := ix.hash(&s.slots[i].key)
			if ix.segment(h) != s {
				t.Fatalf("key %v in the wrong segment", s.slots[i].key)
			}
			if dist := (uint64(i) - h) & s.mask; uint64(c) != dist+1 {
				t.Fatalf("slot %d: ctrl %d, distance %d", i, c, dist)
			}
			if prev := s.ctrl[(uint64(i)-1)&s.mask]; c > 1 && prev+1 < c {
				t.Fatalf("slot %d: distance %d after a slot of ctrl %d", i, c-1, prev)
			}
		}
		if n != s.n {
			t.Fatalf("segment counts %d keys, holds %d", s.n, n)
		}
		total += n
		j += span
	}
	if total != len(want) {
		t.Fatalf("segments hold %d keys, want %d", total, len(want))
	}
}

// TestKeyIndexMatchesMap runs random inserts, overwrites, deletes and
// lookups against a Go map, through enough keys to double and split
// segments and the directory.
func TestKeyIndexMatchesMap(t *testing.T) {
	for _, space := range []uint64{10, 300, 20000} {
		t.Run(fmt.Sprint(space), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(space, 1))
			ix := newKeyIndex()
			want := map[chunk.Key]arena.ID{}
			ops := int(10 * space)
			for op := range ops {
				k := ikey(rng.Uint64N(space))
				switch r := rng.IntN(10); {
				case r < 6:
					id := arena.ID(rng.Uint64() | 1)
					ix.Set(k, id)
					want[k] = id
				case r < 9:
					_, had := want[k]
					if got := ix.Delete(&k); got != had {
						t.Fatalf("Delete(%v) = %v, map had it: %v", k, got, had)
					}
					delete(want, k)
				default:
					id, ok := ix.Get(&k)
					if w, had := want[k]; ok != had || id != w {
						t.Fatalf("Get(%v) = %v, %v; map %v, %v", k, id, ok, w, had)
					}
				}
				if op%(ops/20) == 0 {
					checkIndex(t, ix, want)
				}
			}
			checkIndex(t, ix, want)
			for k := range want { // empty it: every run shifts back cleanly
				if !ix.Delete(&k) {
					t.Fatalf("Delete(%v) missed", k)
				}
				delete(want, k)
			}
			checkIndex(t, ix, want)
		})
	}
}

// TestKeyIndexGrowsToMillions fills past many splits in one go and finds
// every key and no other.
func TestKeyIndexGrowsToMillions(t *testing.T) {
	n := uint64(300000)
	if testing.Short() {
		n = 30000
	}
	ix := newKeyIndex()
	for i := range n {
		ix.Set(ikey(i), arena.ID(i+1))
	}
	want := make(map[chunk.Key]arena.ID, n)
	for i := range n {
		want[ikey(i)] = arena.ID(i + 1)
	}
	checkIndex(t, ix, want)
	for i := n; i < n+1000; i++ {
		if k := ikey(i); ix.Has(&k) {
			t.Fatalf("key %d never stored is found", i)
		}
	}
}

// TestKeyIndexCollidingKeysRehash: with seeds a client could aim at (all
// zero), keys whose first hash word is 0 share one hash. Inserting more
// of them than a probe may pass draws new seeds, and nothing is lost.
func TestKeyIndexCollidingKeysRehash(t *testing.T) {
	ix := newKeyIndex()
	ix.seed = [4]uint64{0, 0, 0, 1}
	want := map[chunk.Key]arena.ID{}
	for i := range uint64(500) {
		var h chunk.Hash
		binary.LittleEndian.PutUint64(h[8:], i+1) // word 0 stays 0
		k := chunk.Key{Scope: 7, Hash: h}
		ix.Set(k, arena.ID(i+1))
		want[k] = arena.ID(i + 1)
	}
	if ix.seed == [4]uint64{0, 0, 0, 1} {
		t.Fatal("500 colliding keys were placed without new seeds")
	}
	checkIndex(t, ix, want)
}

// TestKeyIndexAllocs: once sized, lookups, overwrites and a delete
// followed by an insert allocate nothing.
func TestKeyIndexAllocs(t *testing.T) {
	ix := newKeyIndex()
	for i := range uint64(5000) {
		ix.Set(ikey(i), arena.ID(i+1))
	}
	i := uint64(0)
	a := testing.AllocsPerRun(1000, func() {
		k := ikey(i % 5000)
		ix.Get(&k)
		other := ikey(i + 100000)
		ix.Has(&other)
		ix.Delete(&k)
		ix.Set(k, arena.ID(i+1))
		i++
	})
	if a != 0 {
		t.Fatalf("%v allocations per lookup, delete and insert", a)
	}
}

// FuzzKeyIndex drives the index and a Go map with the same operations:
// each 3 bytes are an operation and a key of a space of 4,096 keys.
func FuzzKeyIndex(f *testing.F) {
	f.Add([]byte{0, 1, 0, 1, 1, 0, 2, 1, 0})
	f.Add(make([]byte, 3000))
	f.Fuzz(func(t *testing.T, ops []byte) {
		ix := newKeyIndex()
		want := map[chunk.Key]arena.ID{}
		for i := 0; i+3 <= len(ops); i += 3 {
			k := ikey(uint64(ops[i+1]) | uint64(ops[i+2]&0x0f)<<8)
			switch ops[i] % 3 {
			case 0:
				id := arena.ID(i + 1)
				ix.Set(k, id)
				want[k] = id
			case 1:
				_, had := want[k]
				if ix.Delete(&k) != had {
					t.Fatalf("Delete(%v) disagrees with the map (%v)", k, had)
				}
				delete(want, k)
			case 2:
				id, ok := ix.Get(&k)
				if w, had := want[k]; ok != had || id != w {
					t.Fatalf("Get(%v) = %v, %v; map %v, %v", k, id, ok, w, had)
				}
			}
		}
		checkIndex(t, ix, want)
	})
}

// cpuPerOp starts counting the process's CPU time; the function it
// returns reports it per operation (cpu-ns/op), which a loaded machine
// moves far less than wall time.
func cpuPerOp(b *testing.B) func() {
	c0 := proccpu.Used()
	return func() {
		b.ReportMetric(float64(proccpu.Used()-c0)/float64(b.N), "cpu-ns/op")
	}
}

// benchKeys returns n keys with uniformly random hashes, as chunk hashes
// are, and a lookup order over them.
func benchKeys(n int) []chunk.Key {
	rng := rand.New(rand.NewPCG(uint64(n), 2))
	keys := make([]chunk.Key, n)
	for i := range keys {
		binary.LittleEndian.PutUint64(keys[i].Hash[:], rng.Uint64())
		binary.LittleEndian.PutUint64(keys[i].Hash[8:], rng.Uint64())
		keys[i].Scope = 0x5eed
	}
	return keys
}

// BenchmarkKeyIndex compares a lookup of a stored key (in random order)
// in the index and in a Go map of the same keys, at 10k and 1M keys, and
// an insert after a delete.
func BenchmarkKeyIndex(b *testing.B) {
	for _, n := range []int{10000, 1000000} {
		keys := benchKeys(n)
		ix := newKeyIndex()
		m := make(map[chunk.Key]arena.ID)
		for i, k := range keys {
			ix.Set(k, arena.ID(i+1))
			m[k] = arena.ID(i + 1)
		}
		order := rand.New(rand.NewPCG(3, 4)).Perm(n)
		b.Run(fmt.Sprintf("get/index/%d", n), func(b *testing.B) {
			b.ReportAllocs()
			defer cpuPerOp(b)()
			for i := range b.N {
				if !ix.Has(&keys[order[i%n]]) {
					b.Fatal("miss")
				}
			}
		})
		b.Run(fmt.Sprintf("get/map/%d", n), func(b *testing.B) {
			b.ReportAllocs()
			defer cpuPerOp(b)()
			for i := range b.N {
				if _, ok := m[keys[order[i%n]]]; !ok {
					b.Fatal("miss")
				}
			}
		})
		b.Run(fmt.Sprintf("replace/index/%d", n), func(b *testing.B) {
			b.ReportAllocs()
			defer cpuPerOp(b)()
			for i := range b.N {
				k := keys[order[i%n]]
				ix.Delete(&k)
				ix.Set(k, arena.ID(i+1))
			}
		})
		b.Run(fmt.Sprintf("replace/map/%d", n), func(b *testing.B) {
			b.ReportAllocs()
			defer cpuPerOp(b)()
			for i := range b.N {
				k := keys[order[i%n]]
				delete(m, k)
				m[k] = arena.ID(i + 1)
			}
		})
	}
}

// BenchmarkKeyIndexPrefix16 is the LOOKUP path's pattern: 16 keys probed
// in turn in a table of 256 (the bench's 16 prompts of 16 chunks).
func BenchmarkKeyIndexPrefix16(b *testing.B) {
	keys := benchKeys(256)
	ix := newKeyIndex()
	m := make(map[chunk.Key]arena.ID)
	for i, k := range keys {
		ix.Set(k, arena.ID(i+1))
		m[k] = arena.ID(i + 1)
	}
	b.Run("index", func(b *testing.B) {
		defer cpuPerOp(b)()
		for i := range b.N {
			p := keys[(i%16)*16 : (i%16)*16+16]
			for j := range p {
				if !ix.Has(&p[j]) {
					b.Fatal("miss")
				}
			}
		}
	})
	b.Run("map", func(b *testing.B) {
		defer cpuPerOp(b)()
		for i := range b.N {
			p := keys[(i%16)*16 : (i%16)*16+16]
			for j := range p {
				if _, ok := m[p[j]]; !ok {
					b.Fatal("miss")
				}
			}
		}
	})
}
