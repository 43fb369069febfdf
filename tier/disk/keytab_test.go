package disk

import (
	"math/rand/v2"
	"testing"

	"kvtier/chunk"
)

// TestKeyTabMatchesMap runs random adds and deletes against a keyTab and a map, with
// slots reused as the index reuses them, and checks every key, held or
// not, after each step. The table starts small, so it grows, overflows
// into later buckets and wraps around its end.
func TestKeyTabMatchesMap(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 2026))
	for round := range 20 {
		tab := newKeyTab(0)
		slots := make([]slot, 1, 64)
		var free []int32
		want := map[chunk.Key]int32{}
		universe := 50 + r.IntN(3000)
		key := func(n int) chunk.Key {
			return chunk.Key{Scope: uint64(n % 3), Hash: chunk.Hash{byte(n), byte(n >> 8), 1}}
		}
		for step := range 6000 {
			k := key(r.IntN(universe))
			if i, ok := want[k]; ok && r.IntN(3) > 0 {
				tab.del(k, i)
				slots[i] = slot{}
				free = append(free, i)
				delete(want, k)
			} else if !ok {
				var i int32
				if n := len(free); n > 0 && r.IntN(2) == 0 {
					i, free = free[n-1], free[:n-1]
				} else {
					i = int32(len(slots))
					slots = append(slots, slot{})
				}
				slots[i] = slot{key: k}
				tab.put(k, i, slots)
				want[k] = i
			}
			if step%97 == 0 || step == 5999 {
				checkTab(t, round, &tab, slots, want, universe, key)
			}
		}
	}
}

func checkTab(t *testing.T, round int, tab *keyTab, slots []slot, want map[chunk.Key]int32, universe int, key func(int) chunk.Key) {
	t.Helper()
	if tab.n != len(want) {
		t.Fatalf("round %d: table holds %d keys, map %d", round, tab.n, len(want))
	}
	for n := range universe + 10 {
		k := key(n)
		i, ok := tab.get(k, slots)
		w, wok := want[k]
		if ok != wok || (ok && i != w) {
			t.Fatalf("round %d: key %d: table (%d, %v), map (%d, %v)", round, n, i, ok, w, wok)
		}
	}
	// Each bucket's count is the entries that passed it on the way from
	// their home bucket; in a table whose keys are moving out, at least
	// that (moves leave the counts).
	checkOver(t, round, tab, &tab.cur, slots, true)
	if tab.old.b != nil {
		checkOver(t, round, tab, &tab.old, slots, false)
	}
}

func checkOver(t *testing.T, round int, tab *keyTab, kt *ktable, slots []slot, exact bool) {
	t.Helper()
	over := make([]uint32, len(kt.b))
	mask := len(kt.b) - 1
	for b := range kt.b {
		for w := range kways {
			if kt.b[b].tag[w] == 0 {
				continue
			}
			for p := int(tab.hash(&slots[kt.b[b].slot[w]].key) >> kt.shift); p != b; p = (p + 1) & mask {
				over[p]++
			}
		}
	}
	for b := range over {
		if over[b] != kt.b[b].over && (exact || over[b] > kt.b[b].over) {
			t.Fatalf("round %d: bucket %d counts %d entries past it, holds %d", round, b, kt.b[b].over, over[b])
		}
	}
}

// TestKeyTabGrowsStepByStep adds keys one by one and checks that the table
// doubles (never more), that its old keys move out a few buckets per put,
// not all at once, and that every key is found, and a deleted one not,
// at each step of the move.
func TestKeyTabGrowsStepByStep(t *testing.T) {
	tab := newKeyTab(0)
	slots := make([]slot, 1, 1<<16)
	want := map[chunk.Key]int32{}
	key := func(n int) chunk.Key {
		return chunk.Key{Scope: 5, Hash: chunk.Hash{byte(n), byte(n >> 8), byte(n >> 16), 2}}
	}
	grows := 0
	for n := range 6000 {
		k := key(n)
		slots = append(slots, slot{key: k})
		before := len(tab.cur.b)
		tab.put(k, int32(len(slots)-1), slots)
		want[k] = int32(len(slots) - 1)
		if got := len(tab.cur.b); got != before {
			grows++
			if got != 2*before {
				t.Fatalf("at %d keys: %d buckets became %d", n+1, before, got)
			}
			if tab.old.b == nil || tab.moved > movePerPut {
				t.Fatalf("at %d keys: the old table was moved at once", n+1)
			}
		}
		if n%5 == 0 { // deletes while keys move
			d := key(n / 2)
			if i, ok := want[d]; ok {
				tab.del(d, i)
				delete(want, d)
			}
		}
		if (tab.old.b != nil && n%3 == 0) || n%500 == 0 {
			checkTab(t, n, &tab, slots, want, n+1, key)
		}
	}
	if grows < 7 { // 8 buckets to 1024
		t.Fatalf("the table doubled %d times for 6000 keys", grows)
	}
	if tab.old.b != nil {
		// Finish any move under way, then measure one at rest.
		tab.move(len(tab.old.b), slots)
	}
	if per := float64(len(tab.cur.b)*64) / float64(tab.max); per < 12 || per > 12.5 {
		t.Fatalf("a full table takes %.1f bytes per key", per)
	}
}

// TestKeyTabFill builds tables in bulk and checks them like one built key
// by key, and that a key in two slots is reported.
func TestKeyTabFill(t *testing.T) {
	for _, n := range []int{0, 1, 7, 100, 5000, 70000} {
		slots := make([]slot, 1, n+1)
		want := map[chunk.Key]int32{}
		for j := range n {
			k := chunk.Key{Scope: 9, Hash: chunk.Hash{byte(j), byte(j >> 8), byte(j >> 16)}}
			want[k] = int32(len(slots))
			slots = append(slots, slot{key: k})
		}
		tab := newKeyTab(0)
		if tab.fill(slots, 1) {
			t.Fatalf("%d keys: a duplicate reported", n)
		}
		checkTab(t, n, &tab, slots, want, n, func(j int) chunk.Key {
			return chunk.Key{Scope: 9, Hash: chunk.Hash{byte(j), byte(j >> 8), byte(j >> 16)}}
		})
		if n > 1 {
			slots = append(slots, slots[1+n/2])
			tab = newKeyTab(0)
			if !tab.fill(slots, 1) {
				t.Fatalf("%d keys: a key in two slots not reported", n)
			}
		}
	}
}

// TestKeyTabAlloc: lookups, adds and deletes at steady size allocate
// nothing.
func TestKeyTabAlloc(t *testing.T) {
	tab := newKeyTab(1000)
	slots := make([]slot, 1001)
	for i := range 1000 {
		slots[i+1].key = chunk.Key{Hash: chunk.Hash{byte(i), byte(i >> 8)}}
		tab.put(slots[i+1].key, int32(i+1), slots)
	}
	n := 0
	allocs := testing.AllocsPerRun(100, func() {
		k := slots[1+n%1000].key
		i, ok := tab.get(k, slots)
		if !ok {
			t.Fatal("missing")
		}
		tab.del(k, i)
		tab.put(k, i, slots)
		n++
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per get, del and put", allocs)
	}
}
