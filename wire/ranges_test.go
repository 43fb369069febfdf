package wire

import (
	"bytes"
	"slices"
	"testing"

	"kvtier/chunk"
)

func rangeMessages() []func() message {
	return []func() message{
		func() message { return new(RetrieveRanges) },
		func() message { return new(RangeDataHeader) },
	}
}

func TestRetrieveRangesRoundTrip(t *testing.T) {
	raw := Keys{Kind: KindRaw, Raw: []chunk.Key{{Scope: 3, Hash: chunk.Hash{1}}, {Scope: 3, Hash: chunk.Hash{2}}}}
	m := RetrieveRanges{Keys: raw, Ranges: []ByteRange{{0, 0, 4096}, {0, 8192, 12288}, {1, 0, 4096}}}
	var got RetrieveRanges
	if err := got.Decode(m.Append(nil)); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Ranges, m.Ranges) || len(got.Keys.Raw) != 2 {
		t.Fatalf("decoded %+v, want %+v", got, m)
	}
	if Served(got.Ranges, 1) != 2 || Served(got.Ranges, 0) != 0 || Served(got.Ranges, 2) != 3 {
		t.Fatal("Served miscounts")
	}
	for _, bad := range [][]ByteRange{
		{{2, 0, 1}},                // no such key
		{{0, 5, 5}},                // empty
		{{0, 6, 5}},                // backwards
		{{0, 0, MaxChunkBody + 1}}, // past the largest chunk
		{{1, 0, 1}, {0, 0, 1}},     // keys out of order
	} {
		b := (&RetrieveRanges{Keys: raw, Ranges: bad}).Append(nil)
		if err := got.Decode(b); err == nil {
			t.Errorf("ranges %v decoded", bad)
		}
	}
	h := RangeDataHeader{DataHeader: DataHeader{Tokens: 0, Sizes: []uint32{16384}}, Sums: []uint64{1, 2}}
	var gh RangeDataHeader
	if err := gh.Decode(h.Append(nil)); err != nil || !slices.Equal(gh.Sums, h.Sums) || !slices.Equal(gh.Sizes, h.Sizes) {
		t.Fatalf("range header: %+v, %v", gh, err)
	}
	if err := gh.Decode(h.Append(nil)[:len(h.Append(nil))-1]); err == nil {
		t.Fatal("a cut range header decoded")
	}
}

// TestRetrieveRangesDecodeAllocs: a connection decoding into the same
// value allocates nothing once warm.
func TestRetrieveRangesDecodeAllocs(t *testing.T) {
	raw := Keys{Kind: KindRaw, Raw: []chunk.Key{{Scope: 3}, {Scope: 4}}}
	b := (&RetrieveRanges{Keys: raw, Ranges: []ByteRange{{0, 0, 10}, {1, 0, 10}}}).Append(nil)
	hb := (&RangeDataHeader{DataHeader: DataHeader{Sizes: []uint32{10, 10}}, Sums: []uint64{1, 2}}).Append(nil)
	var m RetrieveRanges
	var h RangeDataHeader
	allocs := testing.AllocsPerRun(100, func() {
		if m.Decode(b) != nil || h.Decode(hb) != nil {
			t.Fatal("decode failed")
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per decode", allocs)
	}
}

// FuzzDecodeRanges is FuzzDecode for RETRIEVE_RANGES: no panic, and a
// body that decodes encodes back to the same bytes.
func FuzzDecodeRanges(f *testing.F) {
	raw := Keys{Kind: KindRaw, Raw: []chunk.Key{{Scope: 3, Hash: chunk.Hash{1}}, {Scope: 3}}}
	f.Add((&RetrieveRanges{Keys: raw, Ranges: []ByteRange{{0, 0, 1}, {1, 2, 3}}}).Append(nil))
	f.Add((&RetrieveRanges{Keys: Keys{Scope: 1, Kind: KindTokens, Tokens: []uint32{1}}, Ranges: []ByteRange{{7, 0, 1}}}).Append(nil))
	f.Add((&RangeDataHeader{DataHeader: DataHeader{Tokens: 4, Sizes: []uint32{9}}, Sums: []uint64{1, 2}}).Append(nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, mk := range rangeMessages() {
			m := mk()
			if m.Decode(body) != nil {
				continue
			}
			if again := m.Append(nil); !bytes.Equal(again, body) {
				t.Fatalf("%T: decoded %x, encodes back as %x", m, body, again)
			}
		}
	})
}
