package engine_test

import (
	"bytes"
	"context"
	"syscall"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/codec"
	"kvtier/engine"
	"kvtier/internal/redistest"
	"kvtier/kvformat"
	"kvtier/tier"
)

// layeredFixture opens an engine with a disk tier and, when redisURL is
// set, a Redis tier below it, and stores n chunks of a layered scope.
func layeredFixture(t testing.TB, redisURL string, n int) (*engine.Engine, []chunk.Key, [][]byte) {
	t.Helper()
	spec := kvformat.Spec{Layers: 4, KVHeads: 2, HeadDim: 64, DType: kvformat.Float16, Layout: kvformat.Layout2LTD, ChunkTokens: 16}
	o := engine.Options{ChunkSize: 16, RAMBytes: 8 << 20, Policy: "LRU", DiskDir: t.TempDir(), DiskBytes: 16 << 20,
		RemoteTimeout: 2 * time.Second}
	if redisURL != "" {
		o.RemoteURLs = []string{redisURL}
	}
	e, err := engine.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	scope := chunk.Scope{Model: "m", WorldSize: 1, Format: spec.Tag()}
	tokens := make([]uint32, n*16)
	for i := range tokens {
		tokens[i] = uint32(i*5 + 1)
	}
	chunks := make([][]byte, n)
	for i := range chunks {
		chunks[i] = codec.SyntheticKV(spec, 16, uint64(i+1))
	}
	ctx := context.Background()
	req := engine.Request{Scope: scope, Tokens: tokens}
	if got, err := e.Store(ctx, req, chunks); got != n || err != nil {
		t.Fatalf("store: %d %v", got, err)
	}
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	keys, _, _, err := e.Keys(nil, req)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		e.Manager().RAM().Remove(k)
	}
	return e, keys, chunks
}

// slotBytes returns the arena bytes of a slot.
func slotBytes(t *testing.T, e *engine.Engine, s engine.Slot) []byte {
	t.Helper()
	b, err := e.Arena().Region(int64(s.Offset), int(s.Len))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestLayerwiseRedisFailsMidStream keeps chunks 0 and 1 on disk and chunks
// 2 and 3 in Redis only, then kills Redis once the lease is granted: the
// disk chunks stream in and are usable with their stored bytes; the Redis
// chunks fail, are reported unusable and never become RAM chunks; nothing
// waits past the failed reads.
func TestLayerwiseRedisFailsMidStream(t *testing.T) {
	srv := redistest.Start(t)
	e, keys, chunks := layeredFixture(t, srv.URL(), 4)
	disk := e.Manager().Tiers()[1]
	for _, k := range keys[2:] {
		tier.Remove(disk, k)
	}
	ctx := context.Background()
	slots, id, err := e.PrepareRetrieveLayers(ctx, keys, engine.Layers{}, time.Minute, nil)
	if err != nil || len(slots) != 4 {
		t.Fatalf("PrepareRetrieveLayers: %d slots, %v", len(slots), err)
	}
	defer e.Release(id)
	if err := srv.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	usable, ready, err := e.LayerWait(ctx, id, 3)
	if err != nil || ready != 4 || usable > 4 {
		t.Fatalf("LayerWait = %d usable, %d ready, %v", usable, ready, err)
	}
	if usable < 2 {
		t.Fatalf("%d usable chunks: the disk chunks should have loaded", usable)
	}
	for i := range usable {
		if !bytes.Equal(slotBytes(t, e, slots[i]), chunks[i]) {
			t.Fatalf("usable chunk %d holds wrong bytes", i)
		}
	}
	waitDone(t, e, keys, usable)
	for i, k := range keys {
		if e.InRAM(k) != (i < usable) {
			t.Fatalf("chunk %d in RAM: %v with %d usable", i, e.InRAM(k), usable)
		}
	}
}

// TestLayerwiseRedisDownBeforeTheReads is the deterministic half of the
// above: Redis is gone before the retrieve. Its presence cache still lists
// its chunks, but sizing them reads their headers, which fails: the hit
// ends with the disk chunks, which load.
func TestLayerwiseRedisDownBeforeTheReads(t *testing.T) {
	srv := redistest.Start(t)
	e, keys, chunks := layeredFixture(t, srv.URL(), 4)
	disk := e.Manager().Tiers()[1]
	for _, k := range keys[2:] {
		tier.Remove(disk, k)
	}
	srv.Stop()
	ctx := context.Background()
	slots, id, err := e.PrepareRetrieveLayers(ctx, keys, engine.Layers{}, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Release(id)
	usable, _, err := e.LayerWait(ctx, id, 0)
	if len(slots) != 2 || err != nil || usable != 2 {
		t.Fatalf("%d slots, LayerWait = %d usable, %v; want the two disk chunks", len(slots), usable, err)
	}
	for i := range 2 {
		if !bytes.Equal(slotBytes(t, e, slots[i]), chunks[i]) {
			t.Fatalf("chunk %d holds wrong bytes", i)
		}
	}
}

// TestLayerwiseNotLayeredScopeReadsWhole: a scope without a full format
// tag gets whole chunks before the reply, and LayerWait answers AllLayers.
func TestLayerwiseNotLayeredScopeReadsWhole(t *testing.T) {
	e, err := engine.Open(engine.Options{ChunkSize: 16, RAMBytes: 8 << 20, Policy: "LRU", DiskDir: t.TempDir(), DiskBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	req := engine.Request{Scope: chunk.Scope{Model: "m", WorldSize: 1, Format: "float16/KV_2LTD"}, Tokens: make([]uint32, 32)}
	data := [][]byte{bytes.Repeat([]byte{1}, 8192), bytes.Repeat([]byte{2}, 8192)}
	ctx := context.Background()
	if n, err := e.Store(ctx, req, data); n != 2 || err != nil {
		t.Fatal(n, err)
	}
	e.Flush(ctx)
	keys, _, _, _ := e.Keys(nil, req)
	for _, k := range keys {
		e.Manager().RAM().Remove(k)
	}
	slots, id, err := e.PrepareRetrieveLayers(ctx, keys, engine.Layers{}, time.Minute, nil)
	if err != nil || len(slots) != 2 || !e.InRAM(keys[1]) {
		t.Fatalf("%d slots, %v, in RAM %v", len(slots), err, e.InRAM(keys[1]))
	}
	if usable, ready, err := e.LayerWait(ctx, id, 5); usable != 2 || ready != engine.AllLayers || err != nil {
		t.Fatalf("LayerWait = %d, %d, %v", usable, ready, err)
	}
	for i := range 2 {
		if !bytes.Equal(slotBytes(t, e, slots[i]), data[i]) {
			t.Fatalf("chunk %d holds wrong bytes", i)
		}
	}
	e.Release(id)
	if _, _, err := e.LayerWait(ctx, id, 0); err != engine.ErrUnknownLease {
		t.Fatalf("LayerWait on a released lease: %v", err)
	}
}

// waitDone waits until the first usable keys are in RAM: the stream has
// committed them.
func waitDone(t *testing.T, e *engine.Engine, keys []chunk.Key, usable int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; i < usable; {
		if e.InRAM(keys[i]) {
			i++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("chunk %d not committed", i)
		}
		time.Sleep(time.Millisecond)
	}
}
