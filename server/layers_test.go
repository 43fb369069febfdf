package server_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/server"
	"kvtier/wire"
)

// A scope whose format tag gives the geometry: 8 layers of K and V, 2 heads
// of 64 fp16, so a 16-token chunk is 8*2*16*2*64*2 = 64 KiB (pChunkBytes).
var layerScope = chunk.Scope{Model: "llama", WorldSize: 1, Format: "float16/KV_2LTD/8x2x64"}

const (
	layerCount = 8
	layerSpan  = pChunkBytes / (2 * layerCount) // one part of one layer
)

// startDiskService serves an engine with a disk tier in diskDir on a
// local socket.
func startDiskService(t testing.TB, diskDir string) *daemon {
	t.Helper()
	eng, err := engine.Open(engine.Options{ChunkSize: pChunkTokens, RAMBytes: 16 << 20, Policy: "LRU", SaveUnfull: true,
		DiskDir: diskDir, DiskBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	svc := server.NewService(eng, server.ServiceOptions{Token: testToken})
	d := &daemon{eng: eng, svc: svc, sock: filepath.Join(t.TempDir(), "kvtier.sock")}
	ln, err := server.ListenUnix(d.sock, 0)
	if err != nil {
		eng.Close()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- svc.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := errors.Join(svc.Shutdown(ctx), <-served, eng.Close()); err != nil {
			t.Error(err)
		}
	})
	return d
}

// TestLayerwiseRetrieveFromDiskAndRAM stores a prompt, leaves some chunks
// in RAM and the others on disk only, and reads it back layer by layer:
// each layer's K and V ranges hold the stored bytes once LAYER_WAIT says
// so. The geometry comes from the scope's format tag, or from the request
// for a scope whose tag has none (as the vLLM connector's).
func TestLayerwiseRetrieveFromDiskAndRAM(t *testing.T) {
	t.Run("tag", func(t *testing.T) { testLayerwiseRetrieve(t, layerScope, 0, 0) })
	short := layerScope
	short.Format = "float16/KV_2LTD"
	t.Run("request", func(t *testing.T) { testLayerwiseRetrieve(t, short, layerCount, 2) })
}

func testLayerwiseRetrieve(t *testing.T, scope chunk.Scope, layers, parts int) {
	d := startDiskService(t, t.TempDir())
	c := d.local(t)
	ctx := context.Background()
	h, err := c.Scope(ctx, scope)
	if err != nil {
		t.Fatal(err)
	}
	const chunks = 6
	tokens := prompt(chunks*pChunkTokens, 21)
	if n := storeLocal(t, c, h, tokens, 21); n != chunks {
		t.Fatalf("stored %d chunks", n)
	}
	if err := d.eng.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	keys, _, _, err := d.eng.Keys(nil, engine.Request{Scope: scope, Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	ram := d.eng.Manager().RAM()
	for _, j := range []int{1, 2, 4, 5} { // chunks 0 and 3 stay in RAM
		ram.Remove(keys[j])
	}

	slots, err := c.PrepareRetrieveLayers(ctx, client.Tokens(h, tokens, 0), layers, parts, 60_000)
	if err != nil || len(slots.Slots) != chunks || slots.Lease == 0 {
		t.Fatalf("prepare retrieve layers: %+v %v", slots, err)
	}
	for layer := range layerCount {
		r, err := c.LayerWait(ctx, slots.Lease, layer)
		if err != nil || r.Usable != chunks || int(r.Ready) <= layer || r.Ready > layerCount {
			t.Fatalf("LAYER_WAIT %d: %+v %v", layer, r, err)
		}
		for j, s := range slots.Slots {
			b, err := c.Slot(s)
			if err != nil {
				t.Fatal(err)
			}
			want := chunkData(j, 21, pChunkBytes)
			for _, from := range []int{layer * layerSpan, (layerCount + layer) * layerSpan} {
				if !bytes.Equal(b[from:from+layerSpan], want[from:from+layerSpan]) {
					t.Fatalf("chunk %d layer %d: wrong bytes at %d", j, layer, from)
				}
			}
		}
	}
	if err := c.Release(ctx, slots.Lease); err != nil {
		t.Fatal(err)
	}
	if _, err := c.LayerWait(ctx, slots.Lease, 0); !client.IsStatus(err, wire.StatusNotFound) {
		t.Fatalf("LAYER_WAIT on a released lease: %v", err)
	}
}

// TestLayerwiseCorruptLayerIsRecomputed damages layer 5's V range of chunk
// 2 on disk: LAYER_WAIT reports two usable chunks, whose bytes are right.
func TestLayerwiseCorruptLayerIsRecomputed(t *testing.T) {
	dir := t.TempDir()
	d := startDiskService(t, dir)
	c := d.local(t)
	ctx := context.Background()
	h, _ := c.Scope(ctx, layerScope)
	const chunks = 4
	tokens := prompt(chunks*pChunkTokens, 22)
	data := storeRandom(t, c, h, tokens)
	if err := d.eng.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	d.eng.Manager().RAM().Clear(0)
	from := (layerCount + 5) * layerSpan
	damageOnDisk(t, dir, data[2][from:from+256])

	slots, err := c.PrepareRetrieveLayers(ctx, client.Tokens(h, tokens, 0), 0, 0, 60_000)
	if err != nil || len(slots.Slots) != chunks {
		t.Fatalf("prepare retrieve layers: %+v %v", slots, err)
	}
	r, err := c.LayerWait(ctx, slots.Lease, layerCount-1)
	if err != nil || r.Usable != 2 || r.Ready != layerCount {
		t.Fatalf("LAYER_WAIT: %+v %v; want 2 usable chunks", r, err)
	}
	for j := range 2 {
		b, _ := c.Slot(slots.Slots[j])
		if !bytes.Equal(b, data[j]) {
			t.Fatalf("usable chunk %d holds wrong bytes", j)
		}
	}
	c.Release(ctx, slots.Lease)
}

// storeRandom stores the chunks of tokens with random bytes, unlike
// chunkData's, which repeat every 256 bytes and so cannot be found on disk
// by their content.
func storeRandom(t *testing.T, c *client.Client, h uint32, tokens []uint32) [][]byte {
	t.Helper()
	ctx := context.Background()
	n := len(tokens) / pChunkTokens
	slots, err := c.PrepareStore(ctx, client.Tokens(h, tokens, 0), sizesOf(n, pChunkBytes), 0)
	if err != nil || len(slots.Slots) != n {
		t.Fatalf("prepare store: %+v %v", slots, err)
	}
	r := rand.New(rand.NewPCG(uint64(n), 5))
	data := make([][]byte, n)
	for j, s := range slots.Slots {
		data[j] = make([]byte, pChunkBytes)
		for i := range data[j] {
			data[j][i] = byte(r.Uint32())
		}
		dst, err := c.Slot(s)
		if err != nil {
			t.Fatal(err)
		}
		copy(dst, data[j])
	}
	if got, err := c.CommitStore(ctx, slots.Lease, n); err != nil || got != n {
		t.Fatalf("commit: %d %v", got, err)
	}
	return data
}

// damageOnDisk flips a byte where a segment file of dir holds want.
func damageOnDisk(t *testing.T, dir string, want []byte) {
	t.Helper()
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	for _, p := range segs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.Index(b, want); i >= 0 {
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt([]byte{^b[i+7]}, int64(i+7)); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatal("payload bytes not found on disk")
}
