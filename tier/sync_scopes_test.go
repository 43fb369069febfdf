package tier_test

import (
	"context"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/tier"
)

// TestSyncScopesCountsOnlyVisibleScopes: chunks of two scopes are refused
// by the lower tier and one of each leaves RAM. A Sync narrowed to one
// scope counts only that scope's missing chunks, every time; an
// unnarrowed Sync counts both; clearing a scope ends its count.
func TestSyncScopesCountsOnlyVisibleScopes(t *testing.T) {
	ram := newRAM(t, 16<<20)
	failing := &failTier{Tier: newRAM(t, 16<<20)}
	failing.fails.Store(1 << 30)
	m, _ := tier.NewManager(ram, []tier.Tier{failing}, tier.Options{QueueDepth: 4, Writers: 1, WriteWait: -1})
	defer m.Close()
	ctx := context.Background()
	a := func(i int) chunk.Key { return key(100 + i) } // scope 1
	b := func(i int) chunk.Key { k := key(200 + i); k.Scope = 2; return k }
	store := func(k chunk.Key, i int) {
		t.Helper()
		if _, err := m.Store(ctx, []chunk.Key{k}, [][]byte{payload(i, 4096)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		store(a(i), i)
	}
	store(b(0), 10)
	deadline := time.Now().Add(10 * time.Second)
	for _, qs := m.Stats(); qs[0].Failed < 4; _, qs = m.Stats() {
		if time.Now().After(deadline) {
			t.Fatal("the lower tier was never asked to write the chunks")
		}
		time.Sleep(time.Millisecond)
	}
	ram.Remove(a(0)) // gone for good, as an eviction would make it
	ram.Remove(b(0))

	only := func(scope uint64) func(uint64) bool { return func(s uint64) bool { return s == scope } }
	check := func(visible func(uint64) bool, want int, when string) {
		t.Helper()
		rep, err := m.SyncScopes(ctx, visible)
		if err != nil || rep[0].Missing != want || rep[0].Redone != 0 || rep[0].Pending != 0 {
			t.Fatalf("SyncScopes %s = %+v, %v; want %d missing", when, rep, err, want)
		}
	}
	check(only(2), 1, "of scope 2")
	check(only(2), 1, "of scope 2 again")
	check(only(1), 3, "of scope 1")
	check(only(3), 0, "of a scope with no chunks")
	check(nil, 4, "of every scope")

	failing.fails.Store(0)
	check(only(2), 1, "of scope 2 while scope 1's chunks in RAM are written again")
	check(only(1), 1, "of scope 1 after two of its chunks were written again")
	m.Clear(2)
	check(nil, 1, "after scope 2 was cleared")
}
