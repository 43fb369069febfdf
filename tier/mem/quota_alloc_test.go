//go:build !race

package mem

import (
	"context"
	"testing"

	"kvtier/arena"
	"kvtier/chunk"
)

// TestQuotaAllocs: with a quota, a put that evicts the owner's oldest
// chunk and a read of the new one allocate nothing in steady state (the
// race detector, which makes allocation counts meaningless, is off).
func TestQuotaAllocs(t *testing.T) {
	m, _ := quotaTier(t)
	ctx := context.Background()
	data := chunkOf(1, 0)
	keys := make([]chunk.Key, 64)
	for i := range keys {
		keys[i] = k(1, byte(i))
	}
	ids := make([]arena.ID, 1)
	i := 0
	step := func() {
		key := keys[i%len(keys)]
		i++
		if err := m.Put(ctx, key, data); err != nil {
			t.Fatal(err)
		}
		if m.Acquire(keys[(i-1)%len(keys):][:1], ids) != 1 {
			t.Fatal("the chunk just put is not there")
		}
		m.arena.Unref(ids[0])
	}
	for range 2 * len(keys) { // warm: the owner's order and charges at their size
		step()
	}
	if allocs := testing.AllocsPerRun(200, step); allocs != 0 {
		t.Fatalf("%v allocations per put and read under a quota", allocs)
	}
}

// BenchmarkQuotaPut measures a put that evicts one chunk, without a quota
// (the tier's own policy evicts) and with one (the owner's order does),
// in the same run: compare the two lines.
func BenchmarkQuotaPut(b *testing.B) {
	data := chunkOf(1, 0)
	for _, quota := range []bool{false, true} {
		name := map[bool]string{false: "baseline", true: "quota"}[quota]
		b.Run(name, func(b *testing.B) {
			var m *Tier
			if quota {
				m, _ = quotaTier(b)
			} else {
				m = newTier(b, 4*4096, "LRU")
			}
			ctx := context.Background()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if err := m.Put(ctx, k(1, byte(i)), data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
