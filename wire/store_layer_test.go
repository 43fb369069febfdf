package wire

import (
	"bytes"
	"testing"
)

func TestStoreLayerRoundTrip(t *testing.T) {
	m := StoreLayer{Lease: 1<<40 + 7, Layer: 31, Layers: 32, Parts: 2}
	b := m.Append(nil)
	if len(b) != StoreLayerSize {
		t.Fatalf("STORE_LAYER body of %d bytes, want %d", len(b), StoreLayerSize)
	}
	var got StoreLayer
	if err := got.Decode(b); err != nil || got != m {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	tag := StoreLayer{Lease: 1, Layer: 5} // geometry from the scope's tag
	if err := got.Decode(tag.Append(nil)); err != nil || got != tag {
		t.Fatalf("tag geometry round trip: %+v %v", got, err)
	}
	for _, bad := range []StoreLayer{
		{Lease: 1, Layer: 32, Layers: 32, Parts: 2}, // past the last layer
		{Lease: 1, Layer: MaxLayers},                // past any layer
		{Lease: 1, Layers: 32},                      // layers without parts
		{Lease: 1, Parts: 1},                        // parts without layers
		{Lease: 1, Layers: 4, Parts: 3},             // no such layout
	} {
		if err := got.Decode(bad.Append(nil)); err == nil {
			t.Errorf("%+v decoded", bad)
		}
	}
	b[15] = 1
	if err := got.Decode(b); err == nil {
		t.Error("a non-zero reserved byte decoded")
	}
	if err := got.Decode(b[:15]); err == nil {
		t.Error("a short body decoded")
	}
	if err := got.Decode(append(m.Append(nil), 0)); err == nil {
		t.Error("a trailing byte decoded")
	}
	if OpStoreLayer.String() != "STORE_LAYER" || !OpStoreLayer.Valid() || MaxOp < OpStoreLayer {
		t.Fatalf("op %s valid %v, MaxOp %s", OpStoreLayer, OpStoreLayer.Valid(), MaxOp)
	}
}

// FuzzStoreLayer: no input panics the decoder, and what decodes encodes
// back to the same bytes.
func FuzzStoreLayer(f *testing.F) {
	f.Add((&StoreLayer{Lease: 5, Layer: 2, Layers: 4, Parts: 2}).Append(nil))
	f.Add((&StoreLayer{Lease: 5, Layer: 2}).Append(nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, body []byte) {
		var m StoreLayer
		if m.Decode(body) == nil && !bytes.Equal(m.Append(nil), body) {
			t.Fatalf("decoded from %x encodes to %x", body, m.Append(nil))
		}
	})
}
