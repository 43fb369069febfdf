package mem

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"

	"kvtier/arena"
	"kvtier/chunk"
)

func key(scope, i uint64) chunk.Key {
	var h chunk.Hash
	binary.LittleEndian.PutUint64(h[:], i)
	binary.LittleEndian.PutUint64(h[8:], ^i)
	return chunk.Key{Scope: scope, Hash: h}
}

// TestPrefixContainsUnderChurn runs lookups concurrently with stores,
// evictions and removes (run it with -race). Chunks that readers hold a
// reference on cannot be evicted, so a lookup of them must always find
// them; keys never stored must never be found; and a lookup of churning
// keys must not crash or hang.
func TestPrefixContainsUnderChurn(t *testing.T) {
	const slots, churnKeys = 64, 8000
	m := newTier(t, slots*4096, "LRU")
	ctx := context.Background()
	held := make([]chunk.Key, 8)
	ids := make([]arena.ID, len(held))
	for i := range held {
		held[i] = key(7, uint64(i))
		if err := m.Put(ctx, held[i], make([]byte, 4096)); err != nil {
			t.Fatal(err)
		}
	}
	if n := m.Acquire(held, ids); n != len(held) {
		t.Fatalf("acquired %d of %d", n, len(held))
	}
	defer func() {
		for _, id := range ids {
			m.Arena().Unref(id)
		}
	}()
	never := []chunk.Key{key(9, 1), key(9, 2)}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // churn: stores into a full tier evict, some are removed
		defer wg.Done()
		defer stop.Store(true)
		for i := range uint64(churnKeys) {
			if err := m.Put(ctx, key(8, i), make([]byte, 4096)); err != nil {
				t.Error(err)
				return
			}
			if i%3 == 0 {
				m.Remove(key(8, i-1))
			}
		}
	}()
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			churn := make([]chunk.Key, 4)
			for i := uint64(0); !stop.Load(); i++ {
				if n := m.PrefixContains(held); n != len(held) {
					t.Errorf("held chunks: prefix %d of %d", n, len(held))
					return
				}
				if m.Contains(never[i%2]) || m.PrefixContains(never) != 0 {
					t.Error("a key never stored is found")
					return
				}
				for j := range churn {
					churn[j] = key(8, i%churnKeys+uint64(j))
				}
				m.PrefixContains(churn)
			}
		}()
	}
	wg.Wait()
	if got := m.Stats().Objects; got > slots {
		t.Fatalf("%d objects in a tier of %d slots", got, slots)
	}
	// At rest Contains agrees with the index on every key touched.
	for i := range uint64(churnKeys) {
		k := key(8, i)
		want := m.index.Has(&k)
		if got := m.Contains(key(8, i)); got != want {
			t.Fatalf("key %d: Contains %v, index %v", i, got, want)
		}
	}
}

// TestPrefixContainsAllocs: the lookup path allocates nothing.
func TestPrefixContainsAllocs(t *testing.T) {
	m := newTier(t, 16*4096, "LRU")
	keys := make([]chunk.Key, 16)
	for i := range keys {
		keys[i] = key(1, uint64(i))
		if err := m.Put(context.Background(), keys[i], make([]byte, 4096)); err != nil {
			t.Fatal(err)
		}
	}
	if a := testing.AllocsPerRun(100, func() { m.PrefixContains(keys) }); a != 0 {
		t.Fatalf("%v allocations per PrefixContains", a)
	}
}

// BenchmarkPrefixContainsParallel is a 16-key lookup from parallel
// goroutines, the daemon's LOOKUP path in the RAM tier: lookups share the
// tier's read lock.
func BenchmarkPrefixContainsParallel(b *testing.B) {
	a, err := arena.New(arena.Options{Capacity: 1024 * 4096})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	m, err := New(a, "LRU")
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]chunk.Key, 16)
	for i := range keys {
		keys[i] = key(1, uint64(i))
		if err := m.Put(context.Background(), keys[i], make([]byte, 64)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if m.PrefixContains(keys) != len(keys) {
				b.Error("miss")
				return
			}
		}
	})
}
