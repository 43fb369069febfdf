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
			g, y := ix.hash(&s.slots[i].key)
			if ix.segment(g) != s {
				t.Fatalf("key %v in the wrong segment", s.slots[i].key)
			}
			if dist := (uint64(i) - s.home(y)) & s.mask; uint64(c) != dist+1 {
				t.Fatalf("slot %d: ctrl %d, distance %d", i, c, dist)
			}
			if prev := s.ctrl[(uint64(i)-1)&s.mask]; c > 1 && prev+1 < c {
				t.Fatalf("slot %d: distance %d after a slot of ctrl %d", i, c-1, prev)
			}
			if c > s.far+1 || c > maxDist {
				t.Fatalf("slot %d: ctrl %d, segment's far %d, maxDist %d", i, c, s.far, maxDist)
			}
		}
		if n != s.n {
			t.Fatalf("segment counts %d keys, holds %d", s.n, n)
		}
		total += n
		j += span
	}
	total += len(ix.spill)
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

// TestKeyIndexCollidingKeys: with seeds a client could aim at (all
// zero), keys whose first hash word is 0 share both hashes, which no
// segment's seeds separate. Inserting more of them than a probe may pass
// ends (bounded reseeds, growth, then the spill list), loses nothing, and
// never redraws the index's seeds (no rehash of every key).
func TestKeyIndexCollidingKeys(t *testing.T) {
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
	if ix.seed != [4]uint64{0, 0, 0, 1} {
		t.Fatal("the index's seeds were redrawn")
	}
	if len(ix.spill) == 0 || len(ix.spill) > 500-int(maxDist) {
		t.Fatalf("%d keys spilled, want some and at most %d", len(ix.spill), 500-int(maxDist))
	}
	checkIndex(t, ix, want)
	other := chunk.Key{Scope: 7}
	binary.LittleEndian.PutUint64(other.Hash[8:], 10000)
	if ix.Has(&other) {
		t.Fatal("a colliding key never stored is found")
	}
	for k := range want {
		if !ix.Delete(&k) {
			t.Fatalf("Delete(%v) missed", k)
		}
		delete(want, k)
	}
	checkIndex(t, ix, want)
}

// shrink sets the index's sizes and bounds for one test.
func shrink(t testing.TB, minSlots, maxSlots int, dist, reseeds uint8) {
	m0, m1, d0, r0 := minSegSlots, maxSegSlots, maxDist, maxReseeds
	minSegSlots, maxSegSlots, maxDist, maxReseeds = minSlots, maxSlots, dist, reseeds
	t.Cleanup(func() { minSegSlots, maxSegSlots, maxDist, maxReseeds = m0, m1, d0, r0 })
}

// TestKeyIndexOverflowsEnd shrinks the segments and the longest probe
// so that probes overflow all the time, with random keys: every overflow
// is settled by one segment (new seeds, growth, at worst the spill list),
// the index's seeds never change, and every key stays findable. The index
// before per-segment seeds rehashed everything on each overflow and, with
// such constants, did not end.
func TestKeyIndexOverflowsEnd(t *testing.T) {
	for _, c := range []struct {
		min, max       int
		dist, reseeds  uint8
		space          uint64
		wantSpillEmpty bool
	}{
		{4, 16, 3, 2, 5000, false},
		{4, 32, 4, 3, 20000, true},
		{8, 64, 1, 1, 2000, false}, // every collision overflows
	} {
		t.Run(fmt.Sprintf("%d-%d-dist%d-reseeds%d", c.min, c.max, c.dist, c.reseeds), func(t *testing.T) {
			shrink(t, c.min, c.max, c.dist, c.reseeds)
			rng := rand.New(rand.NewPCG(c.space, 5))
			ix := newKeyIndex()
			seed := ix.seed
			want := map[chunk.Key]arena.ID{}
			ops := int(5 * c.space)
			for op := range ops {
				k := ikey(rng.Uint64N(c.space))
				if rng.IntN(4) < 3 {
					id := arena.ID(rng.Uint64() | 1)
					ix.Set(k, id)
					want[k] = id
				} else {
					_, had := want[k]
					if ix.Delete(&k) != had {
						t.Fatalf("Delete(%v) disagrees with the map (%v)", k, had)
					}
					delete(want, k)
				}
				if op%(ops/10) == 0 {
					checkIndex(t, ix, want)
				}
			}
			checkIndex(t, ix, want)
			if ix.seed != seed {
				t.Fatal("the index's seeds were redrawn")
			}
			reseeded := 0
			for _, s := range ix.dir {
				reseeded += int(s.reseeds)
			}
			t.Logf("%d keys, depth %d, %d reseeds in the segments now, %d spilled", ix.Len(), ix.depth, reseeded, len(ix.spill))
			if c.wantSpillEmpty && len(ix.spill) != 0 {
				t.Fatalf("%d random keys spilled", len(ix.spill))
			}
		})
	}
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
// each 3 bytes are an operation and a key of a space of 4,096 keys. With
// small set, segments have 4 to 16 slots and probes overflow past 3 slots,
// so that short inputs reach doublings, splits, reseeds and the spill list
// (the seeds below split; TestFuzzKeyIndexSeedsSplit checks it).
func FuzzKeyIndex(f *testing.F) {
	f.Add(false, []byte{0, 1, 0, 1, 1, 0, 2, 1, 0})
	f.Add(false, make([]byte, 3000))
	f.Add(true, fuzzSplitSeed())
	f.Add(false, fuzzSplitSeed())
	f.Fuzz(func(t *testing.T, small bool, ops []byte) {
		fuzzKeyIndex(t, small, ops)
	})
}

// fuzzSplitSeed inserts 200 distinct keys, deletes every third and looks
// up a few.
func fuzzSplitSeed() []byte {
	var ops []byte
	for i := range 200 {
		ops = append(ops, 0, byte(i*7), byte(i>>5))
	}
	for i := 0; i < 200; i += 3 {
		ops = append(ops, 1, byte(i*7), byte(i>>5), 2, byte(i*7+7), byte((i+1)>>5))
	}
	return ops
}

func fuzzKeyIndex(t *testing.T, small bool, ops []byte) *keyIndex {
	if small {
		shrink(t, 4, 16, 3, 1)
	}
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
	return ix
}

// TestFuzzKeyIndexSeedsSplit: the fuzz seed meant to split does, with the
// small constants (without them 200 keys only double a segment).
func TestFuzzKeyIndexSeedsSplit(t *testing.T) {
	if ix := fuzzKeyIndex(t, true, fuzzSplitSeed()); ix.depth < 2 {
		t.Fatalf("directory of depth %d: fewer splits than expected", ix.depth)
	}
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

// BenchmarkKeyIndexMissChurn: a lookup of a key not held (every LOOKUP
// ends on one), in an index of n keys after 4n replacements of a random
// key held by a new one (count constant; segments split, far grows), and
// in a Go map through the same churn. far-mean and far-max are the
// segments' longest distances after the churn, slot-B/key the index's
// slots (33 bytes each) per key held.
func BenchmarkKeyIndexMissChurn(b *testing.B) {
	for _, n := range []int{10000, 1000000} {
		keys := benchKeys(5 * n)
		ix := newKeyIndex()
		m := make(map[chunk.Key]arena.ID)
		for i, k := range keys[:n] {
			ix.Set(k, arena.ID(i+1))
			m[k] = arena.ID(i + 1)
		}
		rng := rand.New(rand.NewPCG(5, 6))
		held := make([]int, n)
		for i := range held {
			held[i] = i
		}
		for next := n; next < len(keys); next++ {
			j := rng.IntN(n)
			old := &keys[held[j]]
			ix.Delete(old)
			delete(m, *old)
			ix.Set(keys[next], arena.ID(next+1))
			m[keys[next]] = arena.ID(next + 1)
			held[j] = next
		}
		misses := benchKeys(n + 1) // another seed: keys never stored
		farSum, farMax, segs, slots := 0, 0, 0, 0
		for j := 0; j < len(ix.dir); j += 1 << (ix.depth - ix.dir[j].depth) {
			slots += len(ix.dir[j].slots)
			farSum += int(ix.dir[j].far)
			farMax = max(farMax, int(ix.dir[j].far))
			segs++
		}
		b.Run(fmt.Sprintf("index/%d", n), func(b *testing.B) {
			b.ReportAllocs()
			defer cpuPerOp(b)()
			for i := range b.N {
				if ix.Has(&misses[i%n]) {
					b.Fatal("hit")
				}
			}
			b.ReportMetric(float64(farSum)/float64(segs), "far-mean")
			b.ReportMetric(float64(farMax), "far-max")
			b.ReportMetric(33*float64(slots)/float64(n), "slot-B/key")
		})
		b.Run(fmt.Sprintf("map/%d", n), func(b *testing.B) {
			b.ReportAllocs()
			defer cpuPerOp(b)()
			for i := range b.N {
				if _, ok := m[misses[i%n]]; ok {
					b.Fatal("hit")
				}
			}
		})
	}
}

// TestKeyIndexScopeFactorOneSpreads: a scope that makes the second
// product's factor 1 (scope = seed[3]^1) turns g into x^seed[2]; a slot
// hash of g^x would then be seed[2] for every key of that scope, one home
// in every segment under every rotation. The slot hash multiplies x in, so
// those keys still spread.
func TestKeyIndexScopeFactorOneSpreads(t *testing.T) {
	ix := newKeyIndex()
	ix.seed = [4]uint64{11, 22, 33, 44}
	homes := map[uint64]bool{}
	for i := range 1000 {
		var k chunk.Key
		k.Scope = ix.seed[3] ^ 1
		binary.LittleEndian.PutUint64(k.Hash[0:8], uint64(i)*0x9e3779b97f4a7c15+7)
		binary.LittleEndian.PutUint64(k.Hash[8:16], uint64(i)+1)
		_, y := ix.hash(&k)
		homes[y] = true
	}
	if len(homes) < 990 {
		t.Fatalf("1,000 keys of a factor-1 scope have %d distinct slot hashes, want nearly 1,000", len(homes))
	}
}
