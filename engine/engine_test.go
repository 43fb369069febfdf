package engine_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/engine"
)

const chunkTokens = 16

func open(t testing.TB, ram int64, diskDir string, saveUnfull bool) *engine.Engine {
	t.Helper()
	e, err := engine.Open(engine.Options{ChunkSize: chunkTokens, SaveUnfull: saveUnfull, RAMBytes: ram, Policy: "LRU",
		DiskDir: diskDir, DiskBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func tokens(n int, seed uint64) []uint32 {
	r := rand.New(rand.NewPCG(seed, 3))
	t := make([]uint32, n)
	for i := range t {
		t[i] = r.Uint32N(128000)
	}
	return t
}

// chunkBytes makes a chunk's KV bytes from its tokens, so the expected
// bytes of any chunk are known without bookkeeping.
func chunkBytes(toks []uint32) []byte {
	b := make([]byte, 0, 4*len(toks)*8)
	for range 8 {
		for _, t := range toks {
			b = append(b, byte(t), byte(t>>8), byte(t>>16), byte(t>>24))
		}
	}
	return b
}

func chunksOf(toks []uint32, from, to int) [][]byte {
	var out [][]byte
	for i := from; i < to; i++ {
		end := min((i+1)*chunkTokens, len(toks))
		out = append(out, chunkBytes(toks[i*chunkTokens:end]))
	}
	return out
}

func buffers(n int) [][]byte {
	b := make([][]byte, n)
	for i := range b {
		b[i] = make([]byte, 4*chunkTokens*8)
	}
	return b
}

var scope = chunk.Scope{Model: "m", WorldSize: 1, Format: "bfloat16/KV_2LTD"}

func TestLookupStoreRetrieve(t *testing.T) {
	e := open(t, 1<<20, "", false)
	ctx := context.Background()
	toks := tokens(5*chunkTokens+3, 1) // 5 full chunks and a partial one
	req := engine.Request{Scope: scope, Tokens: toks}
	if h, err := e.Lookup(req); err != nil || h.Tokens != 0 {
		t.Fatalf("empty cache Lookup = %+v, %v", h, err)
	}
	n, err := e.Store(ctx, req, chunksOf(toks, 0, 5))
	if err != nil || n != 5 {
		t.Fatalf("Store = %d, %v", n, err)
	}
	h, err := e.Lookup(req)
	if err != nil || h.Tokens != 5*chunkTokens || h.Chunks != 5 || h.ByTier[0] != 5*chunkTokens {
		t.Fatalf("Lookup = %+v, %v; want 80 tokens in RAM", h, err)
	}
	// A prompt sharing the first two chunks hits exactly those.
	other := append(append([]uint32(nil), toks[:2*chunkTokens]...), tokens(3*chunkTokens, 9)...)
	if h, _ := e.Lookup(engine.Request{Scope: scope, Tokens: other}); h.Tokens != 2*chunkTokens {
		t.Fatalf("shared-prefix Lookup = %d tokens, want %d", h.Tokens, 2*chunkTokens)
	}
	// Same tokens in another scope: no hit.
	if h, _ := e.Lookup(engine.Request{Scope: chunk.Scope{Model: "other", WorldSize: 1}, Tokens: toks}); h.Tokens != 0 {
		t.Fatalf("cross-scope hit of %d tokens", h.Tokens)
	}
	dst := buffers(6)
	got, err := e.Retrieve(ctx, req, dst)
	if err != nil || got.Chunks != 5 || got.Tokens != 5*chunkTokens {
		t.Fatalf("Retrieve = %+v, %v", got, err)
	}
	want := chunksOf(toks, 0, 5)
	for i := range want {
		if !bytes.Equal(dst[i], want[i]) {
			t.Fatalf("chunk %d differs", i)
		}
	}
}

func TestSkipPrefix(t *testing.T) {
	e := open(t, 1<<20, "", false)
	ctx := context.Background()
	toks := tokens(4*chunkTokens, 2)
	req := engine.Request{Scope: scope, Tokens: toks, Skip: 2 * chunkTokens}
	// Only chunks 2 and 3 are given; 0 and 1 are "on the GPU".
	if n, err := e.Store(ctx, req, chunksOf(toks, 2, 4)); err != nil || n != 2 {
		t.Fatalf("Store with skip = %d, %v", n, err)
	}
	// The stored chunks are keyed by the full prefix: a lookup from token 0
	// misses chunk 0, so it hits nothing.
	if h, _ := e.Lookup(engine.Request{Scope: scope, Tokens: toks}); h.Tokens != 0 {
		t.Fatalf("Lookup = %d, want 0 (chunk 0 never stored)", h.Tokens)
	}
	dst := buffers(2)
	got, err := e.Retrieve(ctx, req, dst)
	if err != nil || got.Chunks != 2 || got.Tokens != 2*chunkTokens {
		t.Fatalf("Retrieve with skip = %+v, %v", got, err)
	}
	want := chunksOf(toks, 2, 4)
	for i := range want {
		if !bytes.Equal(dst[i], want[i]) {
			t.Fatalf("chunk %d differs", i+2)
		}
	}
	if _, err := e.Store(ctx, engine.Request{Scope: scope, Tokens: toks, Skip: 5}, nil); err == nil {
		t.Fatal("skip not a multiple of the chunk size was accepted")
	}
	if _, err := e.Store(ctx, req, chunksOf(toks, 0, 4)); err == nil {
		t.Fatal("more chunk buffers than chunks after skip was accepted")
	}
}

func TestSaveUnfullChunk(t *testing.T) {
	e := open(t, 1<<20, "", true)
	ctx := context.Background()
	toks := tokens(2*chunkTokens+5, 3)
	req := engine.Request{Scope: scope, Tokens: toks}
	if n, err := e.Store(ctx, req, chunksOf(toks, 0, 3)); err != nil || n != 3 {
		t.Fatalf("Store = %d, %v", n, err)
	}
	if h, _ := e.Lookup(req); h.Tokens != len(toks) {
		t.Fatalf("Lookup = %d, want all %d tokens", h.Tokens, len(toks))
	}
	dst := buffers(3)
	got, _ := e.Retrieve(ctx, req, dst)
	if got.Tokens != len(toks) || !bytes.Equal(dst[2], chunkBytes(toks[2*chunkTokens:])) {
		t.Fatalf("partial chunk: %+v", got)
	}
	// A longer prompt through the partial chunk's tokens does not match it:
	// its third chunk is a different (full) chunk.
	longer := append(append([]uint32(nil), toks...), tokens(20, 4)...)
	if h, _ := e.Lookup(engine.Request{Scope: scope, Tokens: longer}); h.Tokens != 2*chunkTokens {
		t.Fatalf("longer prompt hit %d tokens, want %d", h.Tokens, 2*chunkTokens)
	}
}

func TestDiskSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	toks := tokens(6*chunkTokens, 5)
	req := engine.Request{Scope: scope, Tokens: toks}
	e1, err := engine.Open(engine.Options{ChunkSize: chunkTokens, RAMBytes: 1 << 20, Policy: "LRU", DiskDir: dir, DiskBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := e1.Store(ctx, req, chunksOf(toks, 0, 6)); err != nil || n != 6 {
		t.Fatalf("Store = %d, %v", n, err)
	}
	if err := e1.Close(); err != nil { // flushes the disk queue
		t.Fatal(err)
	}
	e2 := open(t, 1<<20, dir, false)
	h, _ := e2.Lookup(req)
	if h.Tokens != 6*chunkTokens || h.ByTier[1] != 6*chunkTokens {
		t.Fatalf("after restart Lookup = %+v; want all on disk", h)
	}
	dst := buffers(6)
	got, err := e2.Retrieve(ctx, req, dst)
	if err != nil || got.Chunks != 6 {
		t.Fatalf("Retrieve after restart = %+v, %v", got, err)
	}
	for i, want := range chunksOf(toks, 0, 6) {
		if !bytes.Equal(dst[i], want) {
			t.Fatalf("chunk %d differs after restart", i)
		}
	}
	if h, _ := e2.Lookup(req); h.ByTier[0] != 6*chunkTokens {
		t.Fatalf("after retrieve, RAM holds %d tokens; want all promoted", h.ByTier[0])
	}
}

// TestHotPathsDoNotAllocate checks the acceptance bar: no heap allocation
// per chunk on Lookup and on Retrieve from RAM.
func TestHotPathsDoNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	e := open(t, 64<<20, "", false)
	ctx := context.Background()
	toks := tokens(2048*chunkTokens/16, 6) // 128 chunks
	req := engine.Request{Scope: scope, Tokens: toks}
	n := len(toks) / chunkTokens
	if _, err := e.Store(ctx, req, chunksOf(toks, 0, n)); err != nil {
		t.Fatal(err)
	}
	if a := testing.AllocsPerRun(50, func() { e.Lookup(req) }); a != 0 {
		t.Errorf("Lookup of %d chunks: %.1f allocations, want 0", n, a)
	}
	dst := buffers(n)
	if a := testing.AllocsPerRun(50, func() { e.Retrieve(ctx, req, dst) }); a != 0 {
		t.Errorf("Retrieve of %d chunks: %.1f allocations, want 0", n, a)
	}
}

// BenchmarkLookup32K times Lookup of a 32,768-token prompt cut into the
// default 256-token chunks, all in RAM.
func BenchmarkLookup32K(b *testing.B) {
	e, err := engine.Open(engine.Options{ChunkSize: chunk.DefaultSize, RAMBytes: 64 << 20, Policy: "LRU"})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	req := engine.Request{Scope: scope, Tokens: tokens(32768, 7)}
	payload := make([][]byte, 32768/chunk.DefaultSize)
	for i := range payload {
		payload[i] = make([]byte, 4096)
	}
	if _, err := e.Store(context.Background(), req, payload); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		e.Lookup(req)
	}
}

// TestPrefetchPullsPrefixIntoRAM restarts over a disk tier, so the prompt
// is only on disk, and checks that Prefetch promotes every chunk after the
// skipped prefix into RAM without a retrieve.
func TestPrefetchPullsPrefixIntoRAM(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	toks := tokens(4*chunkTokens, 8)
	req := engine.Request{Scope: scope, Tokens: toks}
	e1, err := engine.Open(engine.Options{ChunkSize: chunkTokens, RAMBytes: 1 << 20, Policy: "LRU", DiskDir: dir, DiskBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e1.Store(ctx, req, chunksOf(toks, 0, 4)); err != nil {
		t.Fatal(err)
	}
	e1.Close()
	e2 := open(t, 1<<20, dir, false)
	req.Skip = chunkTokens
	if ok, err := e2.Prefetch(req); !ok || err != nil {
		t.Fatalf("Prefetch = %v, %v", ok, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, by, _ := e2.Manager().Lookup(keysAfterFirst(t, e2, toks))
		if by[0] == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after prefetch RAM holds %d of the 3 chunks after the skip", by[0])
		}
		time.Sleep(time.Millisecond)
	}
	if h, _ := e2.Lookup(engine.Request{Scope: scope, Tokens: toks}); h.ByTier[0] != 3*chunkTokens || h.ByTier[1] != chunkTokens || h.Tokens != 4*chunkTokens {
		t.Fatalf("chunk 0 should still be on disk only: %+v", h)
	}
}

// keysAfterFirst returns the keys of every chunk of toks but the first.
func keysAfterFirst(t *testing.T, e *engine.Engine, toks []uint32) []chunk.Key {
	t.Helper()
	c, err := e.Chunker(scope)
	if err != nil {
		t.Fatal(err)
	}
	return c.Keys(nil, toks)[1:]
}

// TestByTierChargesTheServingTier spreads a prompt with a partial last
// chunk over the tiers (chunk 0 and the partial chunk 2 in RAM, chunk 1 on
// disk only) and checks each tier is charged the tokens it serves.
func TestByTierChargesTheServingTier(t *testing.T) {
	e := open(t, 1<<20, t.TempDir(), true)
	ctx := context.Background()
	toks := tokens(2*chunkTokens+3, 10)
	req := engine.Request{Scope: scope, Tokens: toks}
	if _, err := e.Store(ctx, req, chunksOf(toks, 0, 3)); err != nil {
		t.Fatal(err)
	}
	e.Manager().Flush(ctx)
	c, _ := e.Chunker(scope)
	keys := c.Keys(nil, toks)
	e.Manager().RAM().Remove(keys[1])
	h, err := e.Lookup(req)
	if err != nil || h.Tokens != len(toks) || h.ByTier[0] != chunkTokens+3 || h.ByTier[1] != chunkTokens ||
		h.ChunksByTier[0] != 2 || h.ChunksByTier[1] != 1 {
		t.Fatalf("Lookup = %+v, %v; want RAM %d tokens (2 chunks), disk %d (1 chunk)", h, err, chunkTokens+3, chunkTokens)
	}
}
