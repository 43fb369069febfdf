package kvformat

import (
	"fmt"
	"math"
)

// PagedKind is the shape of an engine's per-layer paged KV buffer. Every
// kind stores a token's K (or V, or latent) as one contiguous row of
// Spec.RowBytes bytes, addressed by slot = block_id*block_size + offset.
type PagedKind uint8

// Paged buffer shapes, per layer.
const (
	// PagedSplit is [2, blocks, block_size, kv_heads, head_dim]: every K
	// block, then every V block (vLLM's FlashAttention layout before the
	// block-first backends). K and V may also live in two separate
	// buffers; see Paged.V.
	PagedSplit PagedKind = 1
	// PagedBlockFirst is [blocks, 2, block_size, kv_heads, head_dim]: each
	// block holds its K rows and then its V rows (newer vLLM backends).
	PagedBlockFirst PagedKind = 2
	// PagedMLA is [blocks, block_size, dim]: one latent row per token.
	PagedMLA PagedKind = 3
)

// String returns the kind's name.
func (k PagedKind) String() string {
	switch k {
	case PagedSplit:
		return "split"
	case PagedBlockFirst:
		return "block-first"
	case PagedMLA:
		return "mla"
	}
	return fmt.Sprintf("PagedKind(%d)", uint8(k))
}

// Paged is an engine's paged KV cache in host memory (pinned CPU buffers or
// a shared mapping), one byte slice per layer. Row geometry (heads, head
// dim, dtype) comes from the Spec it is used with.
type Paged struct {
	Kind      PagedKind
	BlockSize int // tokens per block
	Blocks    int // blocks per layer; valid slots are 0..Blocks*BlockSize-1
	// Layers holds each layer's whole buffer in the shape Kind names.
	Layers [][]byte
	// V, for PagedSplit only, optionally holds each layer's V buffer
	// [blocks, block_size, kv_heads, head_dim] separately; Layers then
	// holds only K. This covers engines that allocate K and V apart
	// (SGLang's layer-first host pool, older vLLM tuples). Nil otherwise.
	V [][]byte
}

// slots returns how many slots each layer holds.
func (p Paged) slots() int { return p.Blocks * p.BlockSize }

// check validates p against spec: a kind that fits the layout, sane block
// geometry, one buffer per layer, each exactly the size its shape needs.
func (p Paged) check(spec Spec) error {
	switch p.Kind {
	case PagedSplit, PagedBlockFirst:
		if spec.Layout.latent() {
			return fmt.Errorf("%w: %v chunks need a %v buffer, not %v", ErrPaged, spec.Layout, PagedMLA, p.Kind)
		}
	case PagedMLA:
		if !spec.Layout.latent() {
			return fmt.Errorf("%w: a %v buffer holds MLA latents and needs layout %v, not %v", ErrPaged, p.Kind, LayoutMLA, spec.Layout)
		}
	default:
		return fmt.Errorf("%w: unknown kind %v", ErrPaged, p.Kind)
	}
	if p.BlockSize < 1 || p.Blocks < 1 {
		return fmt.Errorf("%w: block size %d and blocks %d must both be at least 1", ErrPaged, p.BlockSize, p.Blocks)
	}
	separateV := p.V != nil
	if separateV && p.Kind != PagedSplit {
		return fmt.Errorf("%w: separate V buffers are only allowed for %v, not %v", ErrPaged, PagedSplit, p.Kind)
	}
	halves := spec.parts()
	if separateV {
		halves = 1
	}
	want, ok := product(math.MaxInt, halves, p.Blocks, p.BlockSize, spec.RowBytes())
	if !ok {
		return fmt.Errorf("%w: %d blocks of %d tokens overflow a layer buffer", ErrPaged, p.Blocks, p.BlockSize)
	}
	if err := checkBuffers("Layers", p.Layers, spec.Layers, want); err != nil {
		return err
	}
	if separateV {
		return checkBuffers("V", p.V, spec.Layers, want)
	}
	return nil
}

// checkBuffers checks that bufs holds layers buffers of size bytes each.
func checkBuffers(field string, bufs [][]byte, layers, size int) error {
	if len(bufs) != layers {
		return fmt.Errorf("%w: %s has %d buffers, the spec has %d layers", ErrPaged, field, len(bufs), layers)
	}
	for l, b := range bufs {
		if len(b) != size {
			return fmt.Errorf("%w: %s[%d] is %d bytes, want %d", ErrPaged, field, l, len(b), size)
		}
	}
	return nil
}

// pagedPlane locates one layer's K or V rows in p: the buffer, the byte
// offset of slot 0 and the distance between the starts of two blocks.
// Within a block, rows follow each other at spec.RowBytes. p must have
// passed check.
func (p Paged) pagedPlane(spec Spec, layer int, part Part) (buf []byte, base, blockStride int) {
	row := spec.RowBytes()
	blockBytes := p.BlockSize * row
	switch {
	case p.Kind == PagedBlockFirst:
		return p.Layers[layer], int(part) * blockBytes, 2 * blockBytes
	case p.V != nil && part == V:
		return p.V[layer], 0, blockBytes
	default: // split with K then V in one buffer, or MLA (part is always K)
		return p.Layers[layer], int(part) * p.Blocks * blockBytes, blockBytes
	}
}
