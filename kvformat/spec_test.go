package kvformat

import (
	"errors"
	"strings"
	"testing"
)

// llama3_8B is one tensor-parallel-1 worker of Llama-3-8B with LMCache's
// default chunk size.
var llama3_8B = Spec{Layers: 32, KVHeads: 8, HeadDim: 128, DType: BFloat16, Layout: Layout2LTD, ChunkTokens: 256}

func TestSpecSizes(t *testing.T) {
	s := llama3_8B
	if got := s.RowBytes(); got != 8*128*2 {
		t.Errorf("RowBytes = %d, want %d", got, 8*128*2)
	}
	if got := s.BytesPerToken(); got != 128<<10 {
		t.Errorf("BytesPerToken = %d, want 128 KiB", got)
	}
	if got := s.ChunkBytes(256); got != 32<<20 {
		t.Errorf("ChunkBytes(256) = %d, want 32 MiB", got)
	}
	// DeepSeek-V3 MLA: 61 layers, one 576-wide latent per token.
	mla := Spec{Layers: 61, KVHeads: 1, HeadDim: 576, DType: BFloat16, Layout: LayoutMLA, ChunkTokens: 256}
	if got := mla.BytesPerToken(); got != 61*576*2 {
		t.Errorf("MLA BytesPerToken = %d, want %d", got, 61*576*2)
	}
	if got := s.Tag(); got != "bfloat16/KV_2LTD/32x8x128" {
		t.Errorf("Tag = %q", got)
	}
	if got := s.String(); !strings.Contains(got, "KV_2LTD") || !strings.Contains(got, "layers=32") {
		t.Errorf("String = %q lacks layout or layers", got)
	}
}

func TestSpecValidate(t *testing.T) {
	if err := llama3_8B.Validate(); err != nil {
		t.Fatalf("valid spec rejected: %v", err)
	}
	mutate := func(f func(*Spec)) Spec { s := llama3_8B; f(&s); return s }
	bad := map[string]Spec{
		"zero value":        {},
		"no layers":         mutate(func(s *Spec) { s.Layers = 0 }),
		"negative heads":    mutate(func(s *Spec) { s.KVHeads = -1 }),
		"no head dim":       mutate(func(s *Spec) { s.HeadDim = 0 }),
		"no chunk tokens":   mutate(func(s *Spec) { s.ChunkTokens = 0 }),
		"field over uint32": mutate(func(s *Spec) { s.ChunkTokens = 1 << 33 }),
		"bad dtype":         mutate(func(s *Spec) { s.DType = 77 }),
		"bad layout":        mutate(func(s *Spec) { s.Layout = 4 }),
		"MLA with 8 heads":  mutate(func(s *Spec) { s.Layout = LayoutMLA }),
		"chunk too large":   mutate(func(s *Spec) { s.ChunkTokens = 1 << 30 }),
		"overflowing":       {Layers: maxDim, KVHeads: maxDim, HeadDim: maxDim, DType: Float64, Layout: Layout2LTD, ChunkTokens: maxDim},
	}
	for name, s := range bad {
		if err := s.Validate(); !errors.Is(err, ErrSpec) {
			t.Errorf("%s: Validate = %v, want ErrSpec", name, err)
		}
	}
}

func TestTokensIn(t *testing.T) {
	s := llama3_8B
	per := s.BytesPerToken()
	for _, tokens := range []int{1, 100, 256} {
		if got, err := s.TokensIn(tokens * per); err != nil || got != tokens {
			t.Errorf("TokensIn(%d tokens) = %d, %v", tokens, got, err)
		}
	}
	for _, n := range []int{0, -per, per - 1, per + 1, 257 * per} {
		if _, err := s.TokensIn(n); !errors.Is(err, ErrSize) {
			t.Errorf("TokensIn(%d) = %v, want ErrSize", n, err)
		}
	}
}

func TestRangesAndDims(t *testing.T) {
	const tokens = 10
	small := Spec{Layers: 3, KVHeads: 2, HeadDim: 4, DType: Float16, ChunkTokens: 16}
	row := small.RowBytes() // 16
	tests := []struct {
		layout   Layout
		kvRange  func(layer int, p Part) Range // nil when not contiguous
		layerRng func(layer int) Range         // nil when not contiguous
		dims     [4]int
	}{
		{Layout2LTD,
			func(l int, p Part) Range { return Range{(int(p)*3 + l) * tokens * row, tokens * row} },
			nil, [4]int{2, 3, tokens, 8}},
		{Layout2TD,
			func(l int, p Part) Range { return Range{(l*2 + int(p)) * tokens * row, tokens * row} },
			func(l int) Range { return Range{l * 2 * tokens * row, 2 * tokens * row} }, [4]int{3, 2, tokens, 8}},
		{LayoutT2D,
			nil,
			func(l int) Range { return Range{l * 2 * tokens * row, 2 * tokens * row} }, [4]int{3, tokens, 2, 8}},
	}
	for _, tc := range tests {
		s := small
		s.Layout = tc.layout
		if got := s.Dims(tokens); got != tc.dims {
			t.Errorf("%v Dims = %v, want %v", tc.layout, got, tc.dims)
		}
		for l := range 3 {
			for _, p := range []Part{K, V} {
				got, err := s.KVRange(tokens, l, p)
				switch {
				case tc.kvRange == nil && !errors.Is(err, ErrNotContiguous):
					t.Errorf("%v KVRange(%d, %v) = %v, %v; want ErrNotContiguous", tc.layout, l, p, got, err)
				case tc.kvRange != nil && (err != nil || got != tc.kvRange(l, p)):
					t.Errorf("%v KVRange(%d, %v) = %v, %v; want %v", tc.layout, l, p, got, err, tc.kvRange(l, p))
				}
			}
			got, err := s.LayerRange(tokens, l)
			switch {
			case tc.layerRng == nil && !errors.Is(err, ErrNotContiguous):
				t.Errorf("%v LayerRange(%d) = %v, %v; want ErrNotContiguous", tc.layout, l, got, err)
			case tc.layerRng != nil && (err != nil || got != tc.layerRng(l)):
				t.Errorf("%v LayerRange(%d) = %v, %v; want %v", tc.layout, l, got, err, tc.layerRng(l))
			}
		}
	}

	mla := Spec{Layers: 3, KVHeads: 1, HeadDim: 8, DType: Float16, Layout: LayoutMLA, ChunkTokens: 16}
	if got, err := mla.KVRange(tokens, 2, K); err != nil || got != (Range{2 * tokens * 16, tokens * 16}) {
		t.Errorf("MLA KVRange(2, K) = %v, %v", got, err)
	}
	if got, err := mla.LayerRange(tokens, 2); err != nil || got != (Range{2 * tokens * 16, tokens * 16}) {
		t.Errorf("MLA LayerRange(2) = %v, %v", got, err)
	}
	if got := mla.Dims(tokens); got != [4]int{1, 3, tokens, 8} {
		t.Errorf("MLA Dims = %v", got)
	}
	if _, err := mla.KVRange(tokens, 0, V); !errors.Is(err, ErrArgument) {
		t.Errorf("MLA KVRange(V) = %v, want ErrArgument", err)
	}

	s := small
	s.Layout = Layout2LTD
	for _, args := range [][2]int{{0, 0}, {17, 0}, {tokens, -1}, {tokens, 3}} {
		if _, err := s.KVRange(args[0], args[1], K); !errors.Is(err, ErrArgument) {
			t.Errorf("KVRange(tokens %d, layer %d) = %v, want ErrArgument", args[0], args[1], err)
		}
	}
	if _, err := (Spec{}).KVRange(1, 0, K); !errors.Is(err, ErrSpec) {
		t.Errorf("KVRange on zero Spec = %v, want ErrSpec", err)
	}
}

func TestLayerView(t *testing.T) {
	s := Spec{Layers: 3, KVHeads: 2, HeadDim: 4, DType: Float16, Layout: Layout2LTD, ChunkTokens: 16}
	const tokens = 5
	chunk := make([]byte, s.ChunkBytes(tokens))
	for i := range chunk {
		chunk[i] = byte(i * 7)
	}
	for l := range s.Layers {
		view, err := s.LayerView(chunk, l)
		if err != nil {
			t.Fatal(err)
		}
		for _, half := range []struct {
			p    Part
			got  []byte
			name string
		}{{K, view.K, "K"}, {V, view.V, "V"}} {
			r, _ := s.KVRange(tokens, l, half.p)
			if &half.got[0] != &chunk[r.Off] || len(half.got) != r.Len || cap(half.got) != r.Len {
				t.Errorf("layer %d %s: not the sub-slice chunk[%d:%d] with capped capacity", l, half.name, r.Off, r.End())
			}
		}
	}

	mla := Spec{Layers: 2, KVHeads: 1, HeadDim: 8, DType: Float16, Layout: LayoutMLA, ChunkTokens: 16}
	view, err := mla.LayerView(make([]byte, mla.ChunkBytes(3)), 1)
	if err != nil || len(view.K) != 3*16 || view.V != nil {
		t.Errorf("MLA LayerView = K %d bytes, V %v, %v; want 48 bytes and nil", len(view.K), view.V, err)
	}

	t2d := s
	t2d.Layout = LayoutT2D
	if _, err := t2d.LayerView(make([]byte, t2d.ChunkBytes(2)), 0); !errors.Is(err, ErrNotContiguous) {
		t.Errorf("T2D LayerView = %v, want ErrNotContiguous", err)
	}
	if _, err := s.LayerView(chunk[1:], 0); !errors.Is(err, ErrSize) {
		t.Errorf("LayerView of a ragged chunk = %v, want ErrSize", err)
	}
	if _, err := s.LayerView(chunk, 3); !errors.Is(err, ErrArgument) {
		t.Errorf("LayerView(layer 3) = %v, want ErrArgument", err)
	}
}
