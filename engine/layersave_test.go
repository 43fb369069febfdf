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

// saveSpec is the layered scope of saveFixture: 4 layers, 16 tokens,
// 16 KiB a chunk.
var saveSpec = kvformat.Spec{Layers: 4, KVHeads: 2, HeadDim: 64, DType: kvformat.Float16, Layout: kvformat.Layout2LTD, ChunkTokens: 16}

// saveFixture opens an engine with a disk tier and prepares a store of n
// chunks of saveSpec's scope.
func saveFixture(t *testing.T, n int) (*engine.Engine, tier.Tier, []chunk.Key, []engine.Slot, engine.LeaseID, [][]byte) {
	return saveFixtureTagged(t, n, saveSpec.Tag())
}

// saveFixtureTagged is saveFixture with the scope's format tag given ("":
// none); the chunks are saveSpec's whatever the tag says.
func saveFixtureTagged(t *testing.T, n int, format string) (*engine.Engine, tier.Tier, []chunk.Key, []engine.Slot, engine.LeaseID, [][]byte) {
	t.Helper()
	spec := saveSpec
	e, err := engine.Open(engine.Options{ChunkSize: 16, RAMBytes: 8 << 20, Policy: "LRU", DiskDir: t.TempDir(), DiskBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	scope := chunk.Scope{Model: "m", WorldSize: 1, Format: format}
	if _, err := e.RegisterScope(scope); err != nil {
		t.Fatal(err)
	}
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
// scope's tag, then the commit: every layer's bytes went to the disk
// tier's range writes before the commit, the records were committed from
// them (not written whole), and the chunks are in RAM and on disk with the
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
	// The save took the geometry from the tag: every byte of the three
	// chunks reaches the range writes before the commit.
	total := uint64(3 * len(chunks[0]))
	waitQueue(t, e, "layers given to range writes before the commit", func(q engine.QueueStats) bool { return q.LayerBytes == total })
	if q := e.Stats().Queues[0]; q.LayerSaved != 0 {
		t.Fatalf("%d records committed before the commit", q.LayerSaved)
	}
	for _, k := range keys {
		if tier.Contains(disk, k) {
			t.Fatalf("%v visible on disk before the commit", k)
		}
	}
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
	if q := e.Stats().Queues[0]; q.LayerSaved != 3 || q.LayerBytes != total || q.Failed != 0 {
		t.Fatalf("after the commit: %+v, want 3 records saved by layers", q)
	}
	checkOnDisk(t, disk, keys, chunks)
}

// checkOnDisk reads every chunk back from the disk tier.
func checkOnDisk(t *testing.T, disk tier.Tier, keys []chunk.Key, chunks [][]byte) {
	t.Helper()
	for c, k := range keys {
		got := make([]byte, len(chunks[c]))
		if n, err := disk.Get(context.Background(), k, got); err != nil || n != len(got) || !bytes.Equal(got, chunks[c]) {
			t.Fatalf("chunk %d on disk: %d bytes, %v, equal %v", c, n, err, bytes.Equal(got, chunks[c]))
		}
	}
}

// waitQueue waits up to ten seconds for the disk tier's write queue stats
// to satisfy ok.
func waitQueue(t *testing.T, e *engine.Engine, what string, ok func(engine.QueueStats) bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(e.Stats().Queues[0]); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s: %+v", what, e.Stats().Queues[0])
		}
	}
}

// TestStoreLayerGeometryFromTag: the scope's format tag decides how a
// save splits its chunks. A client's geometry that differs from the tag's,
// or any geometry for a tag whose layout interleaves layers with tokens,
// starts no save — written by the client's spans, the record would differ
// from the RAM copy — and the commit writes the chunks whole; a scope
// without a tag takes the client's geometry.
func TestStoreLayerGeometryFromTag(t *testing.T) {
	t2d := saveSpec
	t2d.Layout = kvformat.LayoutT2D
	for _, c := range []struct {
		name   string
		format string
		given  engine.Layers
		layers bool // saved by layers
	}{
		{"tag, none given", saveSpec.Tag(), engine.Layers{}, true},
		{"tag, same given", saveSpec.Tag(), engine.Layers{Layers: 4, Parts: 2}, true},
		{"tag, other layer count", saveSpec.Tag(), engine.Layers{Layers: 8, Parts: 2}, false},
		{"tag, other parts", saveSpec.Tag(), engine.Layers{Layers: 4, Parts: 1}, false},
		{"KV_T2D tag", t2d.Tag(), engine.Layers{Layers: 4, Parts: 2}, false},
		{"KV_T2D tag, none given", t2d.Tag(), engine.Layers{}, false},
		{"short tag, parts given", "float16/KV_2LTD", engine.Layers{Layers: 4, Parts: 2}, true},
		{"short tag, other parts", "float16/KV_2LTD", engine.Layers{Layers: 4, Parts: 1}, false},
		{"short tag, none given", "float16/KV_2LTD", engine.Layers{}, false},
		{"short KV_T2D tag", "float16/KV_T2D", engine.Layers{Layers: 4, Parts: 2}, false},
		{"no tag", "", engine.Layers{Layers: 4, Parts: 2}, true},
		{"no tag, none given", "", engine.Layers{}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, disk, keys, slots, id, chunks := saveFixtureTagged(t, 2, c.format)
			geo := tier.LayerGeometry{Layers: 4, Parts: 2}
			for layer := range geo.Layers {
				fillSlotLayer(t, e, slots, chunks, geo, layer)
				if !e.StoreLayer(id, layer, c.given) {
					t.Fatal("the store lease was not found")
				}
			}
			if e.HasLayerSave(id) != c.layers {
				t.Fatalf("a save started: %v, want %v", e.HasLayerSave(id), c.layers)
			}
			if c.layers { // before the commit, or the commit may find them not taken yet
				waitQueue(t, e, "layers given to range writes", func(q engine.QueueStats) bool { return q.LayerBytes == uint64(2*len(chunks[0])) })
			}
			if n, err := e.CommitStore(id, 2); n != 2 || err != nil {
				t.Fatalf("commit: %d %v", n, err)
			}
			if err := e.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
			q := e.Stats().Queues[0]
			if saved := q.LayerSaved == 2 && q.LayerBytes == uint64(2*len(chunks[0])); saved != c.layers || (!c.layers && q.LayerBytes != 0) {
				t.Fatalf("%+v: saved by layers %v, want %v", q, saved, c.layers)
			}
			checkOnDisk(t, disk, keys, chunks)
		})
	}
}

// TestStoreLayerShortTagWrongParts: a client that says its chunks are one
// part per layer in a scope whose short tag (dtype/layout, no layer
// count) says KV_2LTD gets no per-layer save. Saved by its spans, "layer
// 0 final" would write K_0 and K_1, the latter not written yet, and the
// disk record, whose pieces are checksummed as they are written and not
// rewritten at the commit, would differ from the RAM copy. The chunks are
// written whole at the commit: the disk tier alone reads back RAM's bytes.
func TestStoreLayerShortTagWrongParts(t *testing.T) {
	e, disk, keys, slots, id, chunks := saveFixtureTagged(t, 2, "float16/KV_2LTD")
	real := tier.LayerGeometry{Layers: 4, Parts: 2}
	for layer := range real.Layers {
		fillSlotLayer(t, e, slots, chunks, real, layer)
		before := e.Stats().Queues[0].LayerBytes
		e.StoreLayer(id, layer, engine.Layers{Layers: 4, Parts: 1})
		if e.HasLayerSave(id) { // let the save write what it was told is final
			waitQueue(t, e, "the layer written", func(q engine.QueueStats) bool { return q.LayerBytes > before })
		}
	}
	if e.HasLayerSave(id) {
		t.Error("a per-layer save started with 1 part per layer in a KV_2LTD scope")
	}
	if n, err := e.CommitStore(id, 2); n != 2 || err != nil {
		t.Fatalf("commit: %d %v", n, err)
	}
	if err := e.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkOnDisk(t, disk, keys, chunks)
}

// TestStoreLayerLeaseExpiresDuringIO: leases that lapse while their layers
// are being written — every layer noticed at once, the lease expired at
// once — leave nothing on disk and give every extent back, round after
// round; then the engine closes. Run under -race, it checks the save's
// goroutines against the lease's end.
func TestStoreLayerLeaseExpiresDuringIO(t *testing.T) {
	e, disk, _, _, _, chunks := saveFixture(t, 1)
	tokens := make([]uint32, 4*16)
	scope := chunk.Scope{Model: "m", WorldSize: 1, Format: saveSpec.Tag()}
	geo := tier.LayerGeometry{Layers: 4, Parts: 2}
	if e.ExpireLeases(time.Now().Add(time.Hour)) != 1 { // the fixture's own lease
		t.Fatal("the fixture's lease did not expire")
	}
	for round := range 20 {
		for i := range tokens {
			tokens[i] = uint32(round*1000 + i)
		}
		keys, _, _, err := e.Keys(nil, engine.Request{Scope: scope, Tokens: tokens})
		if err != nil {
			t.Fatal(err)
		}
		sizes := []uint32{uint32(len(chunks[0])), uint32(len(chunks[0])), uint32(len(chunks[0])), uint32(len(chunks[0]))}
		slots, id, err := e.PrepareStore(keys, sizes, 0, nil)
		if err != nil || len(slots) != 4 {
			t.Fatalf("prepare store: %d slots, %v", len(slots), err)
		}
		src := [][]byte{chunks[0], chunks[0], chunks[0], chunks[0]}
		for layer := range geo.Layers {
			fillSlotLayer(t, e, slots, src, geo, layer)
			e.StoreLayer(id, layer, engine.Layers{})
		}
		// Half the rounds expire as soon as the notices are out, half
		// once some layers reached the range writes.
		if round%2 == 1 {
			before := e.Stats().Queues[0].LayerBytes
			waitQueue(t, e, "a layer written", func(q engine.QueueStats) bool { return q.LayerBytes > before })
		}
		if e.ExpireLeases(time.Now().Add(time.Hour)) != 1 {
			t.Fatal("the lease did not expire")
		}
		waitUsed(t, disk, func(used int64) bool { return used == 0 })
		for _, k := range keys {
			if tier.Contains(disk, k) || e.InRAM(k) {
				t.Fatalf("round %d: %v stored by an expired lease", round, k)
			}
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
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
	// No tag: the save takes the geometry given, 16 KiB chunks as 1,024
	// layers of 8-byte parts: enough layers for every notice of
	// AllocsPerRun to be a new one.
	e, _, _, _, id, _ := saveFixtureTagged(t, 2, "")
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
