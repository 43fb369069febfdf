package wire

import (
	"bytes"
	"testing"
)

func TestLayerMessagesRoundTrip(t *testing.T) {
	w := LayerWait{Lease: 1<<40 + 3, Layer: 31}
	var w2 LayerWait
	if err := w2.Decode(w.Append(nil)); err != nil || w2 != w {
		t.Fatalf("LayerWait round trip: %+v %v", w2, err)
	}
	r := LayerReady{Usable: 7, Ready: 32}
	var r2 LayerReady
	if err := r2.Decode(r.Append(nil)); err != nil || r2 != r {
		t.Fatalf("LayerReady round trip: %+v %v", r2, err)
	}
	if err := w2.Decode((&LayerWait{Layer: MaxLayers}).Append(nil)); err == nil {
		t.Fatal("a layer past MaxLayers decoded")
	}
	if err := w2.Decode(w.Append(nil)[:11]); err == nil {
		t.Fatal("a short LAYER_WAIT decoded")
	}
	if err := r2.Decode(append(r.Append(nil), 0)); err == nil {
		t.Fatal("a LAYER_READY with a trailing byte decoded")
	}
	keys := Keys{Scope: 1, Kind: KindTokens, Skip: 16, Tokens: []uint32{1, 2, 3}}
	pr := PrepareRetrieveLayers{LeaseMS: 9, Layers: 32, Parts: 2, Keys: keys}
	var pr2 PrepareRetrieveLayers
	if err := pr2.Decode(pr.Append(nil)); err != nil || pr2.Layers != 32 || pr2.Parts != 2 || pr2.LeaseMS != 9 || len(pr2.Keys.Tokens) != 3 {
		t.Fatalf("PrepareRetrieveLayers round trip: %+v %v", pr2, err)
	}
	for _, bad := range []PrepareRetrieveLayers{{Layers: 32, Parts: 3, Keys: keys}, {Layers: 32, Keys: keys}, {Parts: 1, Keys: keys}} {
		if err := pr2.Decode(bad.Append(nil)); err == nil {
			t.Fatalf("%+v decoded", bad)
		}
	}
	b := pr.Append(nil)
	b[7] = 1
	if err := pr2.Decode(b); err == nil {
		t.Fatal("a non-zero reserved byte decoded")
	}
	if OpLayerWait.String() != "LAYER_WAIT" || OpPrepareRetrieveLayers.String() != "PREPARE_RETRIEVE_LAYERS" || !OpLayerWait.Valid() {
		t.Fatalf("op names: %s %s", OpPrepareRetrieveLayers, OpLayerWait)
	}
}

// FuzzLayerMessages: no input panics the decoders, and what decodes
// encodes back to the same bytes.
func FuzzLayerMessages(f *testing.F) {
	f.Add((&LayerWait{Lease: 5, Layer: 2}).Append(nil))
	f.Add((&LayerReady{Usable: 1, Ready: 2}).Append(nil))
	f.Add((&PrepareRetrieveLayers{LeaseMS: 1, Layers: 4, Parts: 2, Keys: Keys{Scope: 1, Kind: KindTokens, Tokens: []uint32{1}}}).Append(nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, m := range []message{new(LayerWait), new(LayerReady), new(PrepareRetrieveLayers)} {
			if m.Decode(body) == nil && !bytes.Equal(m.Append(nil), body) {
				t.Fatalf("%T decoded from %x encodes to %x", m, body, m.Append(nil))
			}
		}
	})
}
