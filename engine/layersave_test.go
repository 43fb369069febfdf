package engine_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/codec"
	"kvtier/engine"
	"kvtier/kvformat"
	"kvtier/tier"
)

// saveFixture opens an engine with a disk tier and prepares a store of n
// chunks of a layered scope (4 layers, 16 tokens, 16 KiB a chunk).
func saveFixture(t *testing.T, n int) (*engine.Engine, tier.Tier, []chunk.Key, []engine.Slot, engine.LeaseID, [][]byte) {
	t.Helper()
	spec := kvformat.Spec{Layers: 4, KVHeads: 2, HeadDim: 64, DType: kvformat.Float16, Layout: kvformat.Layout2LTD, ChunkTokens: 16}
	e, err := engine.Open(engine.Options{ChunkSize: 16, RAMBytes: 8 << 20, Policy: "LRU", DiskDir: t.TempDir(), DiskBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if _, err := e.RegisterScope(chunk.Scope{Model: "m", WorldSize: 1, Format: spec.Tag()}); err != nil {
		t.Fatal(err)
	}
	scope := chunk.Scope{Model: "m", WorldSize: 1, Format: spec.Tag()}
	tokens := make([]uint32, n*16)
	for i := range tokens {
		tokens[i] = uint32(i*7 + 3)
	}
	keys, _, _, err := e.Keys(nil, engine.Request{Scope: scope, Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	var chunks [][]byte
	var sizes []uint32
	for i := range n {
		chunks = append(chunks, codec.SyntheticKV(spec, 16, uint64(i+1)))
		sizes = append(sizes, uint32(len(chunks[i])))
	}
	slots, id, err := e.PrepareStore(keys, sizes, 0, nil)
	if err != nil || id == 0 || len(slots) != n {
		t.Fatalf("prepare store: %d slots, lease %d, %v", len(slots), id, err)
	}
	return e, e.Manager().Tiers()[1], keys, slots, id, chunks
}

// fillSlotLayer copies layer of every chunk into its slot.
func fillSlotLayer(t *testing.T, e *engine.Engine, slots []engine.Slot, chunks [][]byte, geo tier.LayerGeometry, layer int) {
	t.Helper()
	for c, s := range slots {
		b := slotBytes(t, e, s)
		for part := range geo.Parts {
			from, to, _ := geo.Range(len(b), layer, part)
			copy(b[from:to], chunks[c][from:to])
		}
	}
}

// TestStoreLayerThenCommit: notices for every layer, the geometry from the
// scope's tag, then the commit: the chunks are in RAM and on disk with the
// bytes filled.
func TestStoreLayerThenCommit(t *testing.T) {
	e, disk, keys, slots, id, chunks := saveFixture(t, 3)
	geo := tier.LayerGeometry{Layers: 4, Parts: 2}
	for layer := range geo.Layers {
		fillSlotLayer(t, e, slots, chunks, geo, layer)
		if !e.StoreLayer(id, layer, engine.Layers{}) {
			t.Fatal("the store lease was not found")
		}
	}
	// The save took the geometry from the tag: its records are reserved
	// before the commit, which a whole write after it would not do.
	waitUsed(t, disk, func(used int64) bool { return used > 0 })
	if e.StoreLayer(id+100, 0, engine.Layers{}) {
		t.Fatal("a notice for an unknown lease was taken")
	}
	if n, err := e.CommitStore(id, 3); n != 3 || err != nil {
		t.Fatalf("commit: %d %v", n, err)
	}
	if e.StoreLayer(id, 1, engine.Layers{}) {
		t.Fatal("a notice after the commit was taken")
	}
	if err := e.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	for c, k := range keys {
		got := make([]byte, len(chunks[c]))
		if n, err := disk.Get(context.Background(), k, got); err != nil || n != len(got) || !bytes.Equal(got, chunks[c]) {
			t.Fatalf("chunk %d on disk: %v", c, err)
		}
	}
}

// TestStoreLayerExpiredLease: a lease that lapses after some notices
// leaves nothing on disk and gives the extents back.
func TestStoreLayerExpiredLease(t *testing.T) {
	e, disk, keys, slots, id, chunks := saveFixture(t, 2)
	geo := tier.LayerGeometry{Layers: 4, Parts: 2}
	for layer := range 2 {
		fillSlotLayer(t, e, slots, chunks, geo, layer)
		e.StoreLayer(id, layer, engine.Layers{Layers: 4, Parts: 2})
	}
	waitUsed(t, disk, func(used int64) bool { return used > 0 }) // the save opens its records in the background
	if e.ExpireLeases(time.Now().Add(time.Hour)) != 1 {
		t.Fatal("the lease did not expire")
	}
	waitUsed(t, disk, func(used int64) bool { return used == 0 })
	for _, k := range keys {
		if tier.Contains(disk, k) || e.InRAM(k) {
			t.Fatalf("%v stored by an expired lease", k)
		}
	}
	if n, err := e.CommitStore(id, 2); err == nil {
		t.Fatalf("commit of an expired lease stored %d", n)
	}
}

// waitUsed waits up to ten seconds for the disk tier's used bytes to satisfy ok.
func waitUsed(t *testing.T, disk tier.Tier, ok func(int64) bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(tier.StatsOf(disk).Used); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("disk tier at %d bytes used", tier.StatsOf(disk).Used)
		}
	}
}

// TestStoreLayerNoticeAllocs: a notice for a lease whose save has started
// allocates nothing (the save's writes run on its own goroutines).
func TestStoreLayerNoticeAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	e, _, _, _, id, _ := saveFixture(t, 2)
	// 16 KiB chunks as 1,024 layers of 8-byte parts: enough layers for
	// every notice of AllocsPerRun to be a new one.
	geo := engine.Layers{Layers: 1024, Parts: 2}
	layer := 0
	notice := func() {
		e.StoreLayer(id, layer, geo)
		layer++
	}
	notice() // the first notice starts the save
	if a := testing.AllocsPerRun(200, notice); a != 0 {
		t.Errorf("a STORE_LAYER notice: %.1f allocations, want 0", a)
	}
	if n, err := e.CommitStore(id, 2); n != 2 || err != nil {
		t.Fatalf("commit: %d %v", n, err)
	}
}
