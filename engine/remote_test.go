package engine_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/codec"
	"kvtier/engine"
	"kvtier/kvformat"
)

// TestRemoteTierThroughTheEngine stacks a shared-filesystem remote tier
// under RAM: stores reach it, and once RAM is emptied a retrieve promotes
// the chunks back from it, decoded by the remote codec.
func TestRemoteTierThroughTheEngine(t *testing.T) {
	spec := kvformat.Spec{Layers: 2, KVHeads: 2, HeadDim: 64, DType: kvformat.Float16, Layout: kvformat.Layout2LTD, ChunkTokens: 16}
	for _, serde := range []string{"raw", "zstd", "int8"} {
		dir := t.TempDir()
		e, err := engine.Open(engine.Options{ChunkSize: 16, RAMBytes: 8 << 20, Policy: "LRU",
			RemoteURLs: []string{"fs://" + dir}, RemoteCodec: serde,
			// The default 100ms breaker deadline is missed by a local
			// write or read under -race on a loaded machine: a missed Put
			// makes Flush fail (not durable), a missed Get a partial
			// retrieve. This test is about the stacking, not deadlines.
			RemoteTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		tiers := e.Manager().Tiers()
		if len(tiers) != 2 || tiers[1].Name() != "fs" {
			t.Fatalf("tiers %v", tiers)
		}
		scope := chunk.Scope{Model: "m", WorldSize: 1, Format: spec.Tag()}
		tokens := make([]uint32, 48)
		for i := range tokens {
			tokens[i] = uint32(i * 3)
		}
		chunks := [][]byte{codec.SyntheticKV(spec, 16, 1), codec.SyntheticKV(spec, 16, 2), codec.SyntheticKV(spec, 16, 3)}
		ctx := context.Background()
		req := engine.Request{Scope: scope, Tokens: tokens}
		if n, err := e.Store(ctx, req, chunks); n != 3 || err != nil {
			t.Fatal(n, err)
		}
		if err := e.Manager().Flush(ctx); err != nil {
			t.Fatal(err)
		}
		files := 0
		// Hidden files are an fs tier's temporary files, not objects.
		filepath.Walk(dir, func(_ string, fi os.FileInfo, _ error) error {
			if fi != nil && fi.Mode().IsRegular() && !strings.HasPrefix(fi.Name(), ".") {
				files++
			}
			return nil
		})
		if files != 3 {
			t.Fatalf("%s: %d objects in the remote store, want 3", serde, files)
		}
		e.Manager().RAM().Clear(0)
		dst := [][]byte{make([]byte, len(chunks[0])), make([]byte, len(chunks[0])), make([]byte, len(chunks[0]))}
		got, err := e.Retrieve(ctx, req, dst)
		if err != nil || got.Chunks != 3 {
			t.Fatalf("%s: retrieve from the remote tier: %+v %v", serde, got, err)
		}
		if serde != "int8" && !bytes.Equal(dst[1], chunks[1]) {
			t.Errorf("%s: lossless remote changed the bytes", serde)
		}
		if e.Manager().Promoted() != 3 {
			t.Errorf("%s: promoted %d", serde, e.Manager().Promoted())
		}
		e.Close()
	}
}

func TestRemoteTierBadURL(t *testing.T) {
	_, err := engine.Open(engine.Options{ChunkSize: 16, RAMBytes: 1 << 20, RemoteURLs: []string{"nosuch://x"}})
	if err == nil {
		t.Fatal("an unknown scheme was accepted")
	}
	_, err = engine.Open(engine.Options{ChunkSize: 16, RAMBytes: 1 << 20, RemoteURLs: []string{"fs:///tmp"}, RemoteCodec: "gzip"})
	if err == nil {
		t.Fatal("an unknown codec was accepted")
	}
}
