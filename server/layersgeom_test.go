package server_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/wire"
)

// The layer geometry a PREPARE_RETRIEVE_LAYERS states (layers, parts) is
// checked before anything is read: against the scope's format tag when it
// says the layout or the layer count, and against the size of every chunk
// of the hit, which must split into parts × layers equal spans. A
// geometry that fails either is BAD_REQUEST, with nothing held and
// nothing read.

// geoCase is a geometry a client states for chunks of pChunkBytes (and,
// with short, a last chunk of shortBytes).
type geoCase struct {
	name          string
	format        string // the scope's format tag
	layers, parts int
	short         bool // the prompt's last chunk is shortBytes long
}

// shortBytes is a last chunk that no even geometry splits: 16 equal
// spans of it would be 62.5 bytes.
const shortBytes = 1000

var refusedGeometries = []geoCase{
	{"not dividing", "", 7, 2, false},
	{"more spans than bytes", "", 40000, 2, false},
	{"largest", "", 65535, 1, false},
	{"parts against the layout", "float16/KV_2LTD", 8, 1, false},
	{"interleaved layout", "float16/KV_T2D", 8, 2, false},
	{"layers against the tag", layerScope.Format, 16, 2, false},
	{"parts against the tag", layerScope.Format, 16, 1, false},
	{"last chunk not dividing", "", 8, 2, true},
}

// TestLayersGeometryRefused stores a prompt, and asks for it layer by
// layer with a geometry that does not fit it, its chunks on disk only and
// then in RAM: BAD_REQUEST, no disk bytes read, no RAM reserved or held,
// and the connection still serves a fitting request byte-exact.
func TestLayersGeometryRefused(t *testing.T) {
	for _, tc := range refusedGeometries {
		t.Run(tc.name, func(t *testing.T) { testLayersGeometryRefused(t, tc) })
	}
}

func testLayersGeometryRefused(t *testing.T, tc geoCase) {
	d := startDiskService(t, t.TempDir())
	c := d.local(t)
	ctx := context.Background()
	scope := chunk.Scope{Model: "geo", WorldSize: 1, Format: tc.format}
	h, err := c.Scope(ctx, scope)
	if err != nil {
		t.Fatal(err)
	}
	const chunks = 3
	tokens := prompt(chunks*pChunkTokens, 31)
	sizes := sizesOf(chunks, pChunkBytes)
	if tc.short {
		sizes[chunks-1] = shortBytes
	}
	data := storeSized(t, c, h, tokens, sizes)
	if err := d.eng.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	keys := client.Tokens(h, tokens, 0)
	for _, where := range []string{"disk", "ram"} {
		if where == "disk" {
			d.eng.Manager().RAM().Clear(0)
		} else if s, err := c.PrepareRetrieve(ctx, keys, 60_000); err != nil || len(s.Slots) != chunks {
			t.Fatalf("prepare retrieve (to promote): %+v %v", s, err)
		} else {
			c.Release(ctx, s.Lease)
		}
		before := d.eng.Stats()
		slots, err := c.PrepareRetrieveLayers(ctx, keys, tc.layers, tc.parts, 60_000)
		if !client.IsStatus(err, wire.StatusBadRequest) {
			t.Fatalf("%s: %d layers of %d parts: %+v %v; want BAD_REQUEST", where, tc.layers, tc.parts, slots, err)
		}
		after := d.eng.Stats()
		if b, a := before.Tiers[1].BytesRead, after.Tiers[1].BytesRead; a != b {
			t.Errorf("%s: the refused request read %d disk bytes", where, a-b)
		}
		if b, a := before.Arena, after.Arena; a.UsedBytes != b.UsedBytes || a.PinnedBytes != b.PinnedBytes || a.Leases != b.Leases {
			t.Errorf("%s: arena before %+v, after %+v", where, b, a)
		}
		// The connection serves the prompt still, read whole.
		s, err := c.PrepareRetrieveLayers(ctx, keys, 0, 0, 60_000)
		if err != nil || len(s.Slots) != chunks {
			t.Fatalf("%s: the request after: %+v %v", where, s, err)
		}
		// The last layer there can be: answered once every read is over.
		if r, err := c.LayerWait(ctx, s.Lease, wire.MaxLayers-1); err != nil || r.Usable != chunks {
			t.Fatalf("%s: LAYER_WAIT: %+v %v", where, r, err)
		}
		for j, sl := range s.Slots {
			if b, _ := c.Slot(sl); !bytes.Equal(b, data[j]) {
				t.Fatalf("%s: chunk %d: wrong bytes", where, j)
			}
		}
		c.Release(ctx, s.Lease)
		// The count the refusal was held to does see the reads: the disk
		// tier counts a range read when it closes, and every read of the
		// stream had closed when the wait for the last layer returned.
		if b, a := after.Tiers[1].BytesRead, d.eng.Stats().Tiers[1].BytesRead; (a > b) != (where == "disk") {
			t.Errorf("%s: the request after read %d disk bytes", where, a-b)
		}
	}
}

// TestLayersGeometryUnknownLayout reads a scope whose tag says nothing of
// the layout with a geometry that splits its chunks into twice the spans
// they were written with: nothing contradicts it, so it is served, and
// each of its layers holds the stored bytes of its own spans once
// LAYER_WAIT says so.
func TestLayersGeometryUnknownLayout(t *testing.T) {
	d := startDiskService(t, t.TempDir())
	c := d.local(t)
	ctx := context.Background()
	h, err := c.Scope(ctx, chunk.Scope{Model: "geo", WorldSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	const chunks, layers = 3, 2 * layerCount
	tokens := prompt(chunks*pChunkTokens, 32)
	data := storeSized(t, c, h, tokens, sizesOf(chunks, pChunkBytes))
	if err := d.eng.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	d.eng.Manager().RAM().Clear(0)
	slots, err := c.PrepareRetrieveLayers(ctx, client.Tokens(h, tokens, 0), layers, 2, 60_000)
	if err != nil || len(slots.Slots) != chunks {
		t.Fatalf("prepare retrieve layers: %+v %v", slots, err)
	}
	defer c.Release(ctx, slots.Lease)
	span := pChunkBytes / (2 * layers)
	for layer := range layers {
		r, err := c.LayerWait(ctx, slots.Lease, layer)
		if err != nil || r.Usable != chunks || int(r.Ready) <= layer {
			t.Fatalf("LAYER_WAIT %d: %+v %v", layer, r, err)
		}
		for j, s := range slots.Slots {
			b, _ := c.Slot(s)
			for _, from := range []int{layer * span, (layers + layer) * span} {
				if !bytes.Equal(b[from:from+span], data[j][from:from+span]) {
					t.Fatalf("chunk %d layer %d: wrong bytes at %d", j, layer, from)
				}
			}
		}
	}
}

// storeSized stores the chunks of tokens with the given sizes, filled
// with bytes distinct per chunk and position, and returns them.
func storeSized(t *testing.T, c *client.Client, h uint32, tokens []uint32, sizes []uint32) [][]byte {
	t.Helper()
	return storeSizedTB(t, c, h, tokens, sizes)
}

// storeSizedTB is storeSized for a fuzz test's setup.
func storeSizedTB(t testing.TB, c *client.Client, h uint32, tokens []uint32, sizes []uint32) [][]byte {
	t.Helper()
	ctx := context.Background()
	slots, err := c.PrepareStore(ctx, client.Tokens(h, tokens, 0), sizes, 0)
	if err != nil || len(slots.Slots) != len(sizes) {
		t.Fatalf("prepare store: %+v %v", slots, err)
	}
	data := make([][]byte, len(sizes))
	for j, s := range slots.Slots {
		data[j] = chunkData(j, 77, int(sizes[j]))
		for i := 0; i+8 <= len(data[j]); i += 4096 { // not found at two places
			copy(data[j][i:], []byte{byte(j), byte(i >> 8), byte(i >> 16), 0xAB})
		}
		dst, err := c.Slot(s)
		if err != nil {
			t.Fatal(err)
		}
		copy(dst, data[j])
	}
	if got, err := c.CommitStore(ctx, slots.Lease, len(sizes)); err != nil || got != len(sizes) {
		t.Fatalf("commit: %d %v", got, err)
	}
	return data
}

var _ = engine.AllLayers

// TestRetrieveRangesBounds asks for ranges that do not fit the chunks —
// past a chunk's end, overlapping past what the chunks hold, at the
// largest offsets, naming a key past the request's — from a daemon whose
// chunks are on disk only and then in RAM, on the local socket and as a
// peer over TCP: BAD_REQUEST before anything is read from disk, the
// connection kept; fitting ranges on the same connection come back
// byte-exact.
func TestRetrieveRangesBounds(t *testing.T) {
	d := startDiskService(t, t.TempDir())
	ln, err := d.svc.ListenTCP("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	go d.svc.Serve(ln) // ends with the service's shutdown
	c := d.local(t)
	ctx := context.Background()
	h, err := c.Scope(ctx, chunk.Scope{Model: "geo", WorldSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	tokens := prompt(3*pChunkTokens, 33)
	sizes := sizesOf(3, pChunkBytes)
	sizes[2] = shortBytes
	data := storeSized(t, c, h, tokens, sizes)
	if err := d.eng.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	keys := client.Tokens(h, tokens, 0)
	bad := map[string][]wire.ByteRange{
		"past the end":          {{Key: 2, From: 0, To: shortBytes + 1}},
		"straddling the end":    {{Key: 0, From: pChunkBytes - 1, To: pChunkBytes + 1}},
		"at the largest offset": {{Key: 1, From: 1<<30 - 1, To: 1 << 30}},
		"past the largest":      {{Key: 1, From: 0, To: 1<<30 + 1}},
		"empty":                 {{Key: 0, From: 10, To: 10}},
		"backwards":             {{Key: 0, From: 10, To: 9}},
		"key past the request":  {{Key: 3, From: 0, To: 1}},
		"keys out of order":     {{Key: 1, From: 0, To: 1}, {Key: 0, From: 0, To: 1}},
		"overlapping past the chunks": {{Key: 0, From: 0, To: pChunkBytes}, {Key: 0, From: 0, To: pChunkBytes},
			{Key: 1, From: 0, To: pChunkBytes}, {Key: 2, From: 0, To: shortBytes}, {Key: 2, From: 0, To: 1}},
	}
	good := []wire.ByteRange{{Key: 0, From: 0, To: 4096}, {Key: 0, From: 100, To: 9000}, {Key: 1, From: pChunkBytes - 1, To: pChunkBytes},
		{Key: 2, From: 0, To: shortBytes}}
	for _, peer := range []bool{false, true} {
		rc := c
		if peer {
			rc = dialRanges(t, ln.Addr().String(), true)
		}
		rh, err := rc.Scope(ctx, chunk.Scope{Model: "geo", WorldSize: 1})
		if err != nil {
			t.Fatal(err)
		}
		rkeys := client.Tokens(rh, tokens, 0)
		for _, where := range []string{"disk", "ram"} {
			if where == "disk" {
				d.eng.Manager().RAM().Clear(0)
			} else if s, err := c.PrepareRetrieve(ctx, keys, 60_000); err != nil || len(s.Slots) != 3 {
				t.Fatalf("prepare retrieve (to promote): %+v %v", s, err)
			} else {
				c.Release(ctx, s.Lease)
			}
			for name, ranges := range bad {
				before := d.eng.Stats().Tiers[1].BytesRead
				_, _, err := rc.RetrieveRanges(ctx, rkeys, ranges, [][]byte{make([]byte, pChunkBytes), make([]byte, pChunkBytes), make([]byte, shortBytes)})
				if !client.IsStatus(err, wire.StatusBadRequest) {
					t.Fatalf("peer %v, %s, %s: %v; want BAD_REQUEST", peer, where, name, err)
				}
				if after := d.eng.Stats().Tiers[1].BytesRead; after != before {
					t.Errorf("peer %v, %s, %s: %d disk bytes read for a refused request", peer, where, name, after-before)
				}
				if err := rc.Ping(ctx); err != nil {
					t.Fatalf("peer %v, %s, %s: the connection did not survive: %v", peer, where, name, err)
				}
			}
			dst := [][]byte{make([]byte, pChunkBytes), make([]byte, pChunkBytes), make([]byte, shortBytes)}
			before := d.eng.Stats().Tiers[1].BytesRead
			got, read, err := rc.RetrieveRanges(ctx, rkeys, good, dst)
			if err != nil || len(got) != 3 || read != len(good) || got[2] != shortBytes {
				t.Fatalf("peer %v, %s: fitting ranges: %v, %d, %v", peer, where, got, read, err)
			}
			// The count the refusals were held to does see reads, once the
			// request has closed them (it gives its scratch memory back
			// after the reply).
			if !eventually(func() bool { return d.eng.RangeBuffersInUse() == 0 }) {
				t.Fatal("the fitting ranges' scratch memory was never given back")
			}
			if after := d.eng.Stats().Tiers[1].BytesRead; (after > before) != (where == "disk") {
				t.Errorf("peer %v, %s: fitting ranges read %d disk bytes", peer, where, after-before)
			}
			for _, r := range good {
				if !bytes.Equal(dst[r.Key][r.From:r.To], data[r.Key][r.From:r.To]) {
					t.Fatalf("peer %v, %s: range %+v: wrong bytes", peer, where, r)
				}
			}
		}
	}
}

// eventually reports whether cond held within ten seconds.
func eventually(cond func() bool) bool {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}
