package wire

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"

	"kvtier/chunk"
)

func layeredReceive(sizes ...uint32) ReceiveLayers {
	keys := make([]chunk.Key, len(sizes))
	for j := range keys {
		keys[j] = chunk.Key{Scope: 3, Hash: chunk.Hash{byte(j + 1)}}
	}
	return ReceiveLayers{Receive: Receive{Transfer: 7, HoldMS: 5, Keys: Keys{Kind: KindRaw, Raw: keys}, Sizes: sizes}}
}

func TestReceiveLayersRangesFor(t *testing.T) {
	m := layeredReceive(16, 32)
	if !m.RangesFor(4, 2, 1) {
		t.Fatal("RangesFor refused chunks of 8 spans")
	}
	// Layer 0 of both chunks first: K_0 and V_0 of chunk 0, then of chunk 1.
	want := []ByteRange{{0, 0, 2}, {0, 8, 10}, {1, 0, 4}, {1, 16, 20}, {0, 2, 4}}
	for i, w := range want {
		if m.Ranges[i] != w {
			t.Fatalf("range %d = %+v, want %+v (all %+v)", i, m.Ranges[i], w, m.Ranges)
		}
	}
	if len(m.Ranges) != 16 {
		t.Fatalf("%d ranges, want 16", len(m.Ranges))
	}
	var out ReceiveLayers
	if err := out.Decode(m.Append(nil)); err != nil {
		t.Fatal(err)
	}
	if len(out.Ranges) != 16 || out.Ranges[4] != want[4] || out.Sizes[1] != 32 {
		t.Fatalf("round trip: %+v", out)
	}
	m.RangesFor(4, 2, 3) // layers 0–2 in one range per part, then layer 3
	if len(m.Ranges) != 8 || m.Ranges[0] != (ByteRange{0, 0, 6}) || m.Ranges[4] != (ByteRange{0, 6, 8}) {
		t.Fatalf("grouped ranges %+v", m.Ranges)
	}
	if err := out.Decode(m.Append(nil)); err != nil {
		t.Fatal(err)
	}
	if m := layeredReceive(16, 30); m.RangesFor(4, 2, 1) {
		t.Fatal("RangesFor split 30 bytes into 8 spans")
	}
}

func TestReceiveLayersRefusals(t *testing.T) {
	cases := map[string][]ByteRange{
		"no ranges":     nil,
		"gap":           {{0, 0, 4}, {0, 5, 8}, {1, 0, 8}},
		"overlap":       {{0, 0, 5}, {0, 4, 8}, {1, 0, 8}},
		"twice":         {{0, 0, 8}, {0, 0, 8}, {1, 0, 8}},
		"chunk missing": {{0, 0, 8}},
		"first missing": {{1, 0, 8}},
		"short":         {{0, 0, 8}, {1, 0, 7}},
		"past the end":  {{0, 0, 8}, {1, 0, 9}},
		"empty range":   {{0, 0, 8}, {1, 0, 0}, {1, 0, 8}},
		"no such chunk": {{0, 0, 8}, {1, 0, 8}, {2, 0, 1}},
	}
	for name, ranges := range cases {
		m := layeredReceive(8, 8)
		m.Ranges = ranges
		var out ReceiveLayers
		if err := out.Decode(m.Append(nil)); err == nil {
			t.Errorf("%s: %+v decoded", name, ranges)
		}
	}
	ok := layeredReceive(8, 8)
	ok.Ranges = []ByteRange{{1, 4, 8}, {0, 0, 8}, {1, 0, 4}} // any order that covers
	var out ReceiveLayers
	if err := out.Decode(ok.Append(nil)); err != nil {
		t.Fatal(err)
	}
	empty := layeredReceive(0)
	empty.Ranges = []ByteRange{{0, 0, 1}}
	if err := out.Decode(empty.Append(nil)); err == nil {
		t.Error("an empty chunk decoded")
	}
	none := layeredReceive()
	if err := out.Decode(none.Append(nil)); err != nil {
		t.Errorf("a request of no chunks (the producer's probe): %v", err)
	}
}

// FuzzReceiveLayers: no panic, a body that decodes encodes back to the
// same bytes, and what decodes covers every chunk exactly once.
func FuzzReceiveLayers(f *testing.F) {
	m := layeredReceive(16, 32)
	m.RangesFor(4, 2, 1)
	f.Add(m.Append(nil))
	m.RangesFor(4, 2, 3)
	f.Add(m.Append(nil))
	f.Add([]byte{})
	var out ReceiveLayers
	f.Fuzz(func(t *testing.T, body []byte) {
		if out.Decode(body) != nil {
			return
		}
		if again := out.Append(nil); !bytes.Equal(again, body) {
			t.Fatalf("decoded %x, encodes back as %x", body, again)
		}
		if err := coverage(&out); err != nil {
			t.Fatal(err)
		}
	})
}

// coverage says how m's ranges fail to cover every byte of every chunk
// exactly once, naming an overlap or a gap: with a bitmap of the chunk's
// bytes when it is small, else by the chunk's ranges in order.
func coverage(m *ReceiveLayers) error {
	byChunk := make([][]ByteRange, len(m.Sizes))
	for _, r := range m.Ranges {
		if int(r.Key) >= len(m.Sizes) {
			return fmt.Errorf("range %v of a chunk that is not there", r)
		}
		byChunk[r.Key] = append(byChunk[r.Key], r)
	}
	for j, rs := range byChunk {
		size := m.Sizes[j]
		if size <= 1<<20 {
			seen := make([]uint64, (size+63)/64)
			for _, r := range rs {
				for b := r.From; b < r.To; b++ {
					if b >= size {
						return fmt.Errorf("chunk %d: byte %d past its %d", j, b, size)
					}
					if seen[b/64]&(1<<(b%64)) != 0 {
						return fmt.Errorf("chunk %d: byte %d covered twice (ranges %v)", j, b, rs)
					}
					seen[b/64] |= 1 << (b % 64)
				}
			}
			for b := uint32(0); b < size; b++ {
				if seen[b/64]&(1<<(b%64)) == 0 {
					return fmt.Errorf("chunk %d: byte %d never covered (ranges %v)", j, b, rs)
				}
			}
			continue
		}
		slices.SortFunc(rs, func(a, b ByteRange) int { return cmp.Compare(a.From, b.From) })
		at := uint32(0)
		for _, r := range rs {
			switch {
			case r.From < at:
				return fmt.Errorf("chunk %d: bytes [%d, %d) covered twice", j, r.From, at)
			case r.From > at:
				return fmt.Errorf("chunk %d: bytes [%d, %d) never covered", j, at, r.From)
			}
			at = r.To
		}
		if at != size {
			return fmt.Errorf("chunk %d: bytes [%d, %d) never covered", j, at, size)
		}
	}
	return nil
}

// TestCoverageTellsOverlapFromGap: a table whose byte count is right but
// which covers one span twice and leaves another out is caught, small or
// large.
func TestCoverageTellsOverlapFromGap(t *testing.T) {
	for _, size := range []uint32{64, 4 << 20} {
		m := layeredReceive(size)
		m.Ranges = []ByteRange{{Key: 0, From: 0, To: size/2 + 8}, {Key: 0, From: size / 2, To: size - 8}}
		if err := coverage(&m); err == nil || !strings.Contains(err.Error(), "twice") {
			t.Errorf("%d bytes, an overlap and a gap: %v", size, err)
		}
		m.Ranges = []ByteRange{{Key: 0, From: 0, To: size / 2}, {Key: 0, From: size/2 + 8, To: size}}
		if err := coverage(&m); err == nil || !strings.Contains(err.Error(), "never") {
			t.Errorf("%d bytes, a gap: %v", size, err)
		}
		m.Ranges = []ByteRange{{Key: 0, From: size / 2, To: size}, {Key: 0, From: 0, To: size / 2}}
		if err := coverage(&m); err != nil {
			t.Errorf("%d bytes, covered: %v", size, err)
		}
	}
}

func TestReceiveLayersOp(t *testing.T) {
	if OpReceiveLayers.String() != "RECEIVE_LAYERS" || !OpReceiveLayers.Valid() || MaxOp != OpReceiveLayers {
		t.Fatalf("op %s valid %v, MaxOp %s", OpReceiveLayers, OpReceiveLayers.Valid(), MaxOp)
	}
}
