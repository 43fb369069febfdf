package server_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/tier"
	"kvtier/wire"
)

// fuzzScopes are the scopes FuzzPrepareRetrieveLayers reads: one whose
// tag says nothing of the layout, one with a complete KV_2LTD tag (8
// layers) and one with an MLA layout.
var fuzzScopes = []string{"", layerScope.Format, "float16/KV_MLA_FMT"}

// fuzzSizes are the chunks of each scope's prompt: the greatest common
// divisor is 4096, so geometries of up to 4096 spans may fit them all.
var fuzzSizes = []uint32{pChunkBytes, pChunkBytes, 3 * 4096}

// FuzzPrepareRetrieveLayers states arbitrary geometries for chunks some
// of which (mask) are on disk only and the rest in RAM. The daemon must
// refuse exactly the geometries that the wire format, the scope's tag or
// a chunk's size rules out (BAD_REQUEST), leaving no byte of RAM
// reserved or held, and serve every other one byte-exact — layer 0 of
// every chunk once LAYER_WAIT says it is in place, every byte once all
// layers are —, never with a chunk left unusable.
func FuzzPrepareRetrieveLayers(f *testing.F) {
	for _, s := range []struct {
		layers      uint16
		parts, pick uint8
		mask        uint8
	}{{0, 0, 0, 7}, {8, 2, 1, 7}, {16, 2, 1, 7}, {7, 2, 0, 7}, {4096, 1, 0, 7}, {2048, 2, 0, 0},
		{65535, 2, 0, 7}, {8, 3, 0, 7}, {0, 1, 0, 7}, {8, 0, 0, 7}, {12, 1, 2, 7}, {12, 2, 2, 7},
		{8, 2, 1, 5}, {16, 2, 0, 2}, {7, 2, 0, 1}, {12, 1, 2, 6}, {0, 0, 1, 4}} {
		f.Add(s.layers, s.parts, s.pick, s.mask)
	}
	d := startFuzzDisk(f)
	c, err := client.DialUnix(context.Background(), d.sock, client.Options{Name: "fuzz"})
	if err != nil {
		f.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	keys := make([]wire.Keys, len(fuzzScopes))
	chunkKeys := make([][]chunk.Key, len(fuzzScopes))
	data := make([][][]byte, len(fuzzScopes))
	for i, format := range fuzzScopes {
		scope := chunk.Scope{Model: "fuzz", WorldSize: 1, Format: format}
		h, err := c.Scope(ctx, scope)
		if err != nil {
			f.Fatal(err)
		}
		tokens := prompt(len(fuzzSizes)*pChunkTokens, uint32(40+i))
		data[i] = storeSizedTB(f, c, h, tokens, fuzzSizes)
		keys[i] = client.Tokens(h, tokens, 0)
		if chunkKeys[i], _, _, err = d.eng.Keys(nil, engine.Request{Scope: scope, Tokens: tokens}); err != nil {
			f.Fatal(err)
		}
	}
	if err := d.eng.Flush(ctx); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, layers uint16, parts, pick, mask uint8) {
		i := int(pick) % len(fuzzScopes)
		// Every chunk in RAM, then those of mask's bits on disk only.
		if s, err := c.PrepareRetrieve(ctx, keys[i], 60_000); err != nil || len(s.Slots) != len(fuzzSizes) {
			t.Fatalf("prepare retrieve (to promote): %+v %v", s, err)
		} else {
			c.Release(ctx, s.Lease)
		}
		for j, k := range chunkKeys[i] {
			if mask&(1<<j) != 0 {
				d.eng.Manager().RAM().Remove(k)
			}
		}
		before := d.eng.Stats().Arena
		slots, err := c.PrepareRetrieveLayers(ctx, keys[i], int(layers), int(parts), 60_000)
		if want := geometryFits(fuzzScopes[i], int(layers), int(parts)); want != nil {
			if !client.IsStatus(err, wire.StatusBadRequest) {
				t.Fatalf("%d layers of %d parts, scope %q, mask %b: %+v %v; want BAD_REQUEST (%v)", layers, parts, fuzzScopes[i], mask, slots, err, want)
			}
			if a := d.eng.Stats().Arena; a.UsedBytes != before.UsedBytes || a.PinnedBytes != before.PinnedBytes || a.Leases != before.Leases {
				t.Fatalf("%d layers of %d parts, scope %q, mask %b: refused, arena before %+v, after %+v", layers, parts, fuzzScopes[i], mask, before, a)
			}
			return
		}
		if err != nil || len(slots.Slots) != len(fuzzSizes) {
			t.Fatalf("%d layers of %d parts, scope %q, mask %b: %+v %v", layers, parts, fuzzScopes[i], mask, slots, err)
		}
		defer c.Release(ctx, slots.Lease)
		geo := tier.LayerGeometry{Layers: int(layers), Parts: int(parts)}
		if layers == 0 && fuzzScopes[i] == layerScope.Format {
			geo = tier.LayerGeometry{Layers: layerCount, Parts: 2}
		}
		r, err := c.LayerWait(ctx, slots.Lease, 0)
		if err != nil || int(r.Usable) != len(fuzzSizes) || r.Ready == 0 {
			t.Fatalf("%d layers of %d parts, mask %b: LAYER_WAIT 0 %+v %v", layers, parts, mask, r, err)
		}
		for j, s := range slots.Slots {
			b, _ := c.Slot(s)
			for part := range geo.Parts {
				if from, to, ok := geo.Range(len(b), 0, part); ok && !bytes.Equal(b[from:to], data[i][j][from:to]) {
					t.Fatalf("%d layers of %d parts, scope %q, mask %b: chunk %d: wrong bytes in layer 0 part %d", layers, parts, fuzzScopes[i], mask, j, part)
				}
			}
		}
		r, err = c.LayerWait(ctx, slots.Lease, wire.MaxLayers-1) // answered once every read is over
		if err != nil || int(r.Usable) != len(fuzzSizes) {
			t.Fatalf("%d layers of %d parts: LAYER_WAIT %+v %v", layers, parts, r, err)
		}
		for j, s := range slots.Slots {
			if b, _ := c.Slot(s); !bytes.Equal(b, data[i][j]) {
				t.Fatalf("%d layers of %d parts, scope %q, mask %b: chunk %d: wrong bytes", layers, parts, fuzzScopes[i], mask, j)
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
func startFuzzDisk(tb testing.TB) *daemon { return startDiskService(tb, tb.TempDir()) }
