package kvformat

import (
	"errors"
	"fmt"
	"math"
)

// Errors returned by this package, always wrapped with details; match them
// with errors.Is.
var (
	ErrSpec          = errors.New("kvformat: invalid spec")
	ErrPaged         = errors.New("kvformat: invalid paged buffer")
	ErrArgument      = errors.New("kvformat: argument out of range")
	ErrSize          = errors.New("kvformat: wrong buffer size")
	ErrSlot          = errors.New("kvformat: slot out of range")
	ErrNotContiguous = errors.New("kvformat: region is not contiguous in this layout")
	ErrHeader        = errors.New("kvformat: malformed header")
)

// MaxChunkBytes bounds the size of one chunk. It keeps every offset this
// package computes far from integer overflow; real chunks are tens of MiB.
const MaxChunkBytes = 1 << 40

// maxDim bounds each Spec field: the header stores them as uint32.
const maxDim = math.MaxUint32

// Spec describes the KV bytes of a chunk: the model's attention geometry,
// the element type, the layout and how many tokens a full chunk holds.
// For MLA models (LayoutMLA) KVHeads is 1 and HeadDim is the width of the
// latent vector (kv_lora_rank + rope dim, e.g. 576 for DeepSeek-V3).
type Spec struct {
	Layers      int    // attention layers held by this worker
	KVHeads     int    // KV heads held by this worker (after tensor parallel split)
	HeadDim     int    // elements per head
	DType       DType  // element type
	Layout      Layout // byte order of a chunk
	ChunkTokens int    // tokens in a full chunk (LMCache's chunk_size, default 256)
}

// Part names the K or the V half of a layer. In LayoutMLA the single latent
// row of a token counts as K, and there is no V.
type Part uint8

// The two halves of a layer's KV.
const (
	K Part = 0
	V Part = 1
)

// String returns "K" or "V".
func (p Part) String() string {
	switch p {
	case K:
		return "K"
	case V:
		return "V"
	}
	return fmt.Sprintf("Part(%d)", uint8(p))
}

// Validate reports whether every field is set and in range and the chunk
// size stays within MaxChunkBytes. Every function taking a Spec calls it.
func (s Spec) Validate() error {
	for _, f := range [...]struct {
		name  string
		value int
	}{{"Layers", s.Layers}, {"KVHeads", s.KVHeads}, {"HeadDim", s.HeadDim}, {"ChunkTokens", s.ChunkTokens}} {
		if f.value < 1 || f.value > maxDim {
			return fmt.Errorf("%w: %s is %d, want 1..%d", ErrSpec, f.name, f.value, maxDim)
		}
	}
	if !s.DType.Valid() {
		return fmt.Errorf("%w: dtype %v is not supported", ErrSpec, s.DType)
	}
	if !s.Layout.Valid() {
		return fmt.Errorf("%w: layout %v is not supported", ErrSpec, s.Layout)
	}
	if s.Layout.latent() && s.KVHeads != 1 {
		return fmt.Errorf("%w: %v holds one latent vector per token, so KVHeads must be 1 (got %d) and HeadDim the latent width",
			ErrSpec, s.Layout, s.KVHeads)
	}
	if _, ok := product(MaxChunkBytes, s.parts(), s.Layers, s.KVHeads, s.HeadDim, s.DType.Size(), s.ChunkTokens); !ok {
		return fmt.Errorf("%w: a full chunk of %v would exceed %d bytes", ErrSpec, s, MaxChunkBytes)
	}
	return nil
}

// product multiplies non-negative factors and reports whether the result
// stays at or below limit, without ever overflowing.
func product(limit int, factors ...int) (int, bool) {
	p := 1
	for _, f := range factors {
		if f < 0 || (f > 0 && p > limit/f) {
			return 0, false
		}
		p *= f
	}
	return p, p <= limit
}

// parts is 2 (K and V) or 1 (the MLA latent).
func (s Spec) parts() int {
	if s.Layout.latent() {
		return 1
	}
	return 2
}

// RowBytes is the size of one token's K row (or V row, or MLA latent row)
// in one layer: KVHeads*HeadDim elements. Like the other size methods it
// assumes a valid Spec.
func (s Spec) RowBytes() int { return s.KVHeads * s.HeadDim * s.DType.Size() }

// BytesPerToken is what one token adds to a chunk, over all layers.
func (s Spec) BytesPerToken() int { return s.parts() * s.Layers * s.RowBytes() }

// ChunkBytes is the size of a chunk holding the given number of tokens.
func (s Spec) ChunkBytes(tokens int) int { return tokens * s.BytesPerToken() }

// TokensIn returns how many tokens a chunk of n bytes holds, failing when n
// is not a whole number of tokens between 1 and ChunkTokens.
func (s Spec) TokensIn(n int) (int, error) {
	if err := s.Validate(); err != nil {
		return 0, err
	}
	per := s.BytesPerToken()
	if n <= 0 || n%per != 0 || n/per > s.ChunkTokens {
		return 0, fmt.Errorf("%w: %d bytes is not 1..%d tokens of %d bytes", ErrSize, n, s.ChunkTokens, per)
	}
	return n / per, nil
}

// Range is the byte range [Off, Off+Len) of a region inside a chunk.
type Range struct{ Off, Len int }

// End returns Off+Len.
func (r Range) End() int { return r.Off + r.Len }

// KVRange returns where the K or V rows of one layer sit in a chunk of the
// given number of tokens: a contiguous [tokens, hidden] block in every
// layout but KV_T2D, which interleaves K and V per token and so gives
// ErrNotContiguous. For LayoutMLA only K (the latent rows) exists.
func (s Spec) KVRange(tokens, layer int, p Part) (Range, error) {
	if err := s.checkRegion(tokens, layer, p); err != nil {
		return Range{}, err
	}
	if s.Layout == LayoutT2D {
		return Range{}, fmt.Errorf("%w: %v interleaves K and V of every token", ErrNotContiguous, s.Layout)
	}
	base, _ := s.placement(tokens, layer, p)
	return Range{Off: base, Len: tokens * s.RowBytes()}, nil
}

// LayerRange returns where all of one layer's KV sits in a chunk of the
// given number of tokens: contiguous in KV_T2D, KV_2TD and KV_MLA_FMT, whose
// chunks are per-layer objects back to back. KV_2LTD keeps a layer's K and
// V apart and gives ErrNotContiguous; use KVRange for each half.
func (s Spec) LayerRange(tokens, layer int) (Range, error) {
	if err := s.checkRegion(tokens, layer, K); err != nil {
		return Range{}, err
	}
	if s.Layout == Layout2LTD {
		return Range{}, fmt.Errorf("%w: %v stores a layer's K and V in separate halves", ErrNotContiguous, s.Layout)
	}
	n := s.parts() * tokens * s.RowBytes()
	return Range{Off: layer * n, Len: n}, nil
}

// LayerView is one layer's K and V rows inside a chunk, as sub-slices that
// share the chunk's memory. V is nil for LayoutMLA.
type LayerView struct {
	K, V []byte
}

// LayerView slices one layer's K and V out of chunk without copying; the
// number of tokens follows from len(chunk). The slices' capacity ends with
// the region, so appending to one can never overwrite its neighbour.
// KV_T2D interleaves K and V and gives ErrNotContiguous.
func (s Spec) LayerView(chunk []byte, layer int) (LayerView, error) {
	tokens, err := s.TokensIn(len(chunk))
	if err != nil {
		return LayerView{}, err
	}
	var view LayerView
	for p := range Part(s.parts()) {
		r, err := s.KVRange(tokens, layer, p)
		if err != nil {
			return LayerView{}, err
		}
		half := chunk[r.Off:r.End():r.End()]
		if p == K {
			view.K = half
		} else {
			view.V = half
		}
	}
	return view, nil
}

// Dims returns the logical tensor shape of a chunk of the given number of
// tokens: [2, L, T, H] for KV_2LTD, [L, T, 2, H] for KV_T2D, [L, 2, T, H]
// for KV_2TD and [1, L, T, D] for KV_MLA_FMT, where H is KVHeads*HeadDim.
// LMCache's lm:// header carries this shape (for one layer, L is 1).
func (s Spec) Dims(tokens int) [4]int {
	hidden := s.KVHeads * s.HeadDim
	switch s.Layout {
	case LayoutT2D:
		return [4]int{s.Layers, tokens, 2, hidden}
	case Layout2TD:
		return [4]int{s.Layers, 2, tokens, hidden}
	case LayoutMLA:
		return [4]int{1, s.Layers, tokens, hidden}
	}
	return [4]int{2, s.Layers, tokens, hidden}
}

// String describes the whole spec for logs and errors.
func (s Spec) String() string {
	return fmt.Sprintf("%v %v layers=%d kv_heads=%d head_dim=%d chunk_tokens=%d",
		s.Layout, s.DType, s.Layers, s.KVHeads, s.HeadDim, s.ChunkTokens)
}

// checkRegion validates the spec and the arguments naming one region.
func (s Spec) checkRegion(tokens, layer int, p Part) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if tokens < 1 || tokens > s.ChunkTokens {
		return fmt.Errorf("%w: %d tokens, want 1..%d", ErrArgument, tokens, s.ChunkTokens)
	}
	if layer < 0 || layer >= s.Layers {
		return fmt.Errorf("%w: layer %d, want 0..%d", ErrArgument, layer, s.Layers-1)
	}
	if int(p) >= s.parts() {
		return fmt.Errorf("%w: %v has no %v part", ErrArgument, s.Layout, p)
	}
	return nil
}

// placement returns where token 0 of one layer's K or V goes in a chunk of
// the given number of tokens, and the distance between consecutive tokens.
// The package doc spells out the same formulas.
func (s Spec) placement(tokens, layer int, p Part) (base, stride int) {
	row := s.RowBytes()
	switch s.Layout {
	case Layout2TD:
		return (layer*2 + int(p)) * tokens * row, row
	case LayoutT2D:
		return (layer*tokens*2 + int(p)) * row, 2 * row
	case LayoutMLA:
		return layer * tokens * row, row
	}
	return (int(p)*s.Layers + layer) * tokens * row, row
}
