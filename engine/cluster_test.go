package engine_test

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/engine"
)

// where lists the local tiers holding k.
func where(e *engine.Engine, k chunk.Key) []string {
	var out []string
	e.ListChunks([]uint64{k.Scope}, func(name string, key chunk.Key, _ int) bool {
		if key == k {
			out = append(out, name)
		}
		return true
	})
	return out
}

// mustBytes reads k through the engine and checks its bytes.
func mustBytes(t *testing.T, e *engine.Engine, k chunk.Key, want []byte) {
	t.Helper()
	var r engine.Reads
	defer r.Release()
	if n, err := e.Acquire(context.Background(), []chunk.Key{k}, &r); n != 1 || err != nil {
		t.Fatalf("acquire %v: %d, %v", k, n, err)
	}
	if !bytes.Equal(r.Bytes(0), want) {
		t.Fatalf("%v: wrong bytes", k)
	}
}

// TestPinKeyHoldsUntilUnpinned: a pinned chunk stays in RAM through
// pressure that evicts its neighbours, and is evictable once released.
func TestPinKeyHoldsUntilUnpinned(t *testing.T) {
	e := open(t, 64<<10, t.TempDir(), false)
	keys := storedKeys(t, e, 4, 1)
	if err := e.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	lease, tiers := e.PinKey(keys[0], time.Minute)
	if lease == 0 || !slices.Equal(tiers, []string{"mem", "disk"}) {
		t.Fatalf("pin: lease %d in %v", lease, tiers)
	}
	if l, tiers := e.PinKey(chunk.Key{Scope: 9}, time.Minute); l != 0 || len(tiers) != 0 {
		t.Fatalf("pinning a chunk nobody holds: lease %d in %v", l, tiers)
	}
	press := func(from, to uint64) { // more than the RAM tier holds
		for seed := from; seed < to; seed++ {
			storedKeys(t, e, 8, seed)
			if err := e.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	press(2, 40)
	if !e.InRAM(keys[0]) || e.InRAM(keys[1]) {
		t.Fatalf("after pressure: pinned in RAM %v, unpinned in RAM %v", e.InRAM(keys[0]), e.InRAM(keys[1]))
	}
	if !e.Release(lease) {
		t.Fatal("the pin's lease was not active")
	}
	press(40, 80)
	if e.InRAM(keys[0]) {
		t.Fatal("an unpinned chunk survived the pressure")
	}
}

// TestClearTierCopyMoveDrop covers the per-tier operations: clear one
// tier, move a chunk down to disk and back up to RAM with its bytes
// intact, and drop chunks from every local tier.
func TestClearTierCopyMoveDrop(t *testing.T) {
	e := open(t, 1<<20, t.TempDir(), false)
	toks := tokens(4*chunkTokens, 1)
	keys := storedKeys(t, e, 4, 1)
	want := chunksOf(toks, 0, 4)
	ctx := context.Background()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ClearTier(0, "s3"); err == nil {
		t.Fatal("clearing a tier the daemon lacks: no error")
	}
	if n, err := e.ClearTier(keys[0].Scope, "mem"); n != 4 || err != nil {
		t.Fatalf("clear RAM: %d, %v", n, err)
	}
	if got := where(e, keys[0]); !slices.Equal(got, []string{"disk"}) {
		t.Fatalf("after clearing RAM, chunk 0 is in %v", got)
	}
	res, err := e.CopyToTier(ctx, keys[:2], "mem", true)
	if err != nil || res != (engine.CopyResult{Copied: 2, Dropped: 2}) {
		t.Fatalf("move up: %+v, %v", res, err)
	}
	if got := where(e, keys[0]); !slices.Equal(got, []string{"mem"}) {
		t.Fatalf("after the move up, chunk 0 is in %v", got)
	}
	mustBytes(t, e, keys[0], want[0])
	res, err = e.CopyToTier(ctx, []chunk.Key{keys[0], {Scope: 9}}, "disk", false)
	if err != nil || res != (engine.CopyResult{Copied: 1, Missing: 1}) {
		t.Fatalf("copy down: %+v, %v", res, err)
	}
	res, err = e.CopyToTier(ctx, keys[:1], "disk", true)
	if err != nil || res != (engine.CopyResult{Already: 1, Dropped: 1}) {
		t.Fatalf("move down: %+v, %v", res, err)
	}
	if got := where(e, keys[0]); !slices.Equal(got, []string{"disk"}) {
		t.Fatalf("after the move down, chunk 0 is in %v", got)
	}
	mustBytes(t, e, keys[0], want[0]) // read from disk, promoted again
	if n := e.DropLocal(append(keys, chunk.Key{Scope: 9})); n != 4 {
		t.Fatalf("dropped %d chunks, want 4", n)
	}
	for _, k := range keys {
		if got := where(e, k); len(got) != 0 {
			t.Fatalf("%v still in %v after the drop", k, got)
		}
	}
}
