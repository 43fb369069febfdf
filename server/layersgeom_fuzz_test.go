package server_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/server"
	"kvtier/wire"
)

// fuzzScopes are the scopes FuzzPrepareRetrieveLayers reads: one whose
// tag says nothing of the layout, one with a complete KV_2LTD tag (8
// layers) and one with an MLA layout.
var fuzzScopes = []string{"", layerScope.Format, "float16/KV_MLA_FMT"}

// fuzzSizes are the chunks of each scope's prompt: the greatest common
// divisor is 4096, so geometries of up to 4096 spans may fit them all.
var fuzzSizes = []uint32{pChunkBytes, pChunkBytes, 3 * 4096}

// FuzzPrepareRetrieveLayers states arbitrary geometries for chunks on
// disk or in RAM. The daemon must refuse exactly the geometries that the
// wire format, the scope's tag or a chunk's size rules out (BAD_REQUEST),
// and serve every other one byte-exact, never with a chunk left
// unusable.
func FuzzPrepareRetrieveLayers(f *testing.F) {
	for _, s := range []struct {
		layers      uint16
		parts, pick uint8
		disk        bool
	}{{0, 0, 0, true}, {8, 2, 1, true}, {16, 2, 1, true}, {7, 2, 0, true}, {4096, 1, 0, true}, {2048, 2, 0, false},
		{65535, 2, 0, true}, {8, 3, 0, true}, {0, 1, 0, true}, {8, 0, 0, true}, {12, 1, 2, true}, {12, 2, 2, true}} {
		f.Add(s.layers, s.parts, s.pick, s.disk)
	}
	d := startFuzzDisk(f)
	c, err := client.DialUnix(context.Background(), d.sock, client.Options{Name: "fuzz"})
	if err != nil {
		f.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	keys := make([]wire.Keys, len(fuzzScopes))
	data := make([][][]byte, len(fuzzScopes))
	for i, format := range fuzzScopes {
		h, err := c.Scope(ctx, chunk.Scope{Model: "fuzz", WorldSize: 1, Format: format})
		if err != nil {
			f.Fatal(err)
		}
		tokens := prompt(len(fuzzSizes)*pChunkTokens, uint32(40+i))
		data[i] = storeSizedTB(f, c, h, tokens, fuzzSizes)
		keys[i] = client.Tokens(h, tokens, 0)
	}
	if err := d.eng.Flush(ctx); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, layers uint16, parts, pick uint8, disk bool) {
		i := int(pick) % len(fuzzScopes)
		if disk {
			d.eng.Manager().RAM().Clear(0)
		}
		slots, err := c.PrepareRetrieveLayers(ctx, keys[i], int(layers), int(parts), 60_000)
		if want := geometryFits(fuzzScopes[i], int(layers), int(parts)); want != nil {
			if !client.IsStatus(err, wire.StatusBadRequest) {
				t.Fatalf("%d layers of %d parts, scope %q: %+v %v; want BAD_REQUEST (%v)", layers, parts, fuzzScopes[i], slots, err, want)
			}
			return
		}
		if err != nil || len(slots.Slots) != len(fuzzSizes) {
			t.Fatalf("%d layers of %d parts, scope %q: %+v %v", layers, parts, fuzzScopes[i], slots, err)
		}
		defer c.Release(ctx, slots.Lease)
		r, err := c.LayerWait(ctx, slots.Lease, wire.MaxLayers-1) // answered once every read is over
		if err != nil || int(r.Usable) != len(fuzzSizes) {
			t.Fatalf("%d layers of %d parts: LAYER_WAIT %+v %v", layers, parts, r, err)
		}
		for j, s := range slots.Slots {
			if b, _ := c.Slot(s); !bytes.Equal(b, data[i][j]) {
				t.Fatalf("%d layers of %d parts, scope %q: chunk %d: wrong bytes", layers, parts, fuzzScopes[i], j)
			}
		}
	})
}

// geometryFits is the oracle: nil when the daemon must serve the
// geometry for the chunks of fuzzSizes in a scope with format, else why
// it must refuse it.
func geometryFits(format string, layers, parts int) error {
	switch {
	case parts > 2 || (layers == 0) != (parts == 0):
		return errors.New("not a geometry")
	case layers == 0:
		return nil
	case format == layerScope.Format && (layers != layerCount || parts != 2):
		return errors.New("against the tag")
	case format == "float16/KV_MLA_FMT" && parts != 1:
		return errors.New("against the layout")
	}
	for _, n := range fuzzSizes {
		if int(n)%(layers*parts) != 0 {
			return errors.New("a chunk does not split")
		}
	}
	return nil
}

// startFuzzDisk serves an engine with a disk tier on a local socket for
// the whole of a fuzz test (each worker process has its own).
func startFuzzDisk(tb testing.TB) *daemon {
	tb.Helper()
	eng, err := engine.Open(engine.Options{ChunkSize: pChunkTokens, RAMBytes: 16 << 20, Policy: "LRU", SaveUnfull: true,
		DiskDir: tb.TempDir(), DiskBytes: 64 << 20})
	if err != nil {
		tb.Fatal(err)
	}
	svc := server.NewService(eng, server.ServiceOptions{Token: testToken})
	d := &daemon{eng: eng, svc: svc, sock: filepath.Join(tb.TempDir(), "kvtier.sock")}
	ln, err := server.ListenUnix(d.sock, 0)
	if err != nil {
		eng.Close()
		tb.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- svc.Serve(ln) }()
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := errors.Join(svc.Shutdown(ctx), <-served, eng.Close()); err != nil {
			tb.Error(err)
		}
	})
	return d
}
