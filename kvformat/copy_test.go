package kvformat

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestGather2LTDByteOrder pins the exact bytes of a KV_2LTD chunk, the
// order a Python connector relies on (see the package doc). Elements are
// uint8 so every byte is one element; each paged byte encodes where it
// came from: layer*64 + kv*32 + slot*4 + element.
func TestGather2LTDByteOrder(t *testing.T) {
	spec := Spec{Layers: 2, KVHeads: 2, HeadDim: 2, DType: Uint8, Layout: Layout2LTD, ChunkTokens: 4}
	// Split paged buffers [2, blocks 3, block size 2, heads 2, dim 2].
	paged := Paged{Kind: PagedSplit, BlockSize: 2, Blocks: 3, Layers: make([][]byte, 2)}
	for l := range paged.Layers {
		buf := make([]byte, 2*3*2*4)
		for kv := range 2 {
			for slot := range 6 {
				for e := range 4 {
					buf[(kv*6+slot)*4+e] = byte(l*64 + kv*32 + slot*4 + e)
				}
			}
		}
		paged.Layers[l] = buf
	}
	chunk := make([]byte, spec.ChunkBytes(2))
	if err := Gather(chunk, spec, paged, []int64{5, 0}); err != nil {
		t.Fatal(err)
	}
	want := []byte{
		// K, layer 0: token 0 (slot 5) heads 0,1 × dims 0,1, then token 1 (slot 0)
		20, 21, 22, 23, 0, 1, 2, 3,
		// K, layer 1
		84, 85, 86, 87, 64, 65, 66, 67,
		// V, layer 0
		52, 53, 54, 55, 32, 33, 34, 35,
		// V, layer 1
		116, 117, 118, 119, 96, 97, 98, 99,
	}
	if !bytes.Equal(chunk, want) {
		t.Errorf("KV_2LTD chunk\n got %v\nwant %v", chunk, want)
	}
}

// TestGatherMultiByteElements checks that element bytes travel verbatim:
// a bfloat16 element stays in the engine's (little-endian) byte order.
func TestGatherMultiByteElements(t *testing.T) {
	spec := Spec{Layers: 1, KVHeads: 1, HeadDim: 2, DType: BFloat16, Layout: Layout2LTD, ChunkTokens: 2}
	// One block of 2 slots; K then V; rows of 2 bf16 elements.
	layer := []byte{
		0x80, 0x3f, 0x00, 0x40, // K slot 0: 1.0, 2.0
		0x40, 0x40, 0x80, 0x40, // K slot 1: 3.0, 4.0
		0xa0, 0x40, 0xc0, 0x40, // V slot 0: 5.0, 6.0
		0xe0, 0x40, 0x00, 0x41, // V slot 1: 7.0, 8.0
	}
	paged := Paged{Kind: PagedSplit, BlockSize: 2, Blocks: 1, Layers: [][]byte{layer}}
	chunk := make([]byte, spec.ChunkBytes(1))
	if err := Gather(chunk, spec, paged, []int32{1}); err != nil {
		t.Fatal(err)
	}
	if want := []byte{0x40, 0x40, 0x80, 0x40, 0xe0, 0x40, 0x00, 0x41}; !bytes.Equal(chunk, want) {
		t.Errorf("chunk = % x, want % x", chunk, want)
	}
}

// layoutCase is one combination of chunk layout and paged shape.
type layoutCase struct {
	layout    Layout
	kind      PagedKind
	separateV bool
}

func (c layoutCase) String() string {
	s := c.layout.String() + "/" + c.kind.String()
	if c.separateV {
		s += "+V"
	}
	return s
}

var layoutCases = []layoutCase{
	{Layout2LTD, PagedSplit, false}, {Layout2LTD, PagedSplit, true}, {Layout2LTD, PagedBlockFirst, false},
	{Layout2TD, PagedSplit, false}, {Layout2TD, PagedSplit, true}, {Layout2TD, PagedBlockFirst, false},
	{LayoutT2D, PagedSplit, false}, {LayoutT2D, PagedSplit, true}, {LayoutT2D, PagedBlockFirst, false},
	{LayoutMLA, PagedMLA, false},
}

// testSpec is small enough to check byte by byte and big enough for runs
// to cross block boundaries: 40 slots in blocks of 4, rows of 16 bytes.
func testSpec(layout Layout) Spec {
	s := Spec{Layers: 3, KVHeads: 2, HeadDim: 4, DType: BFloat16, Layout: layout, ChunkTokens: 16}
	if layout == LayoutMLA {
		s.KVHeads, s.HeadDim = 1, 8
	}
	return s
}

// newPaged allocates a paged buffer for spec filled with random bytes.
func newPaged(rng *rand.Rand, spec Spec, c layoutCase, blockSize, blocks int) Paged {
	p := Paged{Kind: c.kind, BlockSize: blockSize, Blocks: blocks}
	rows := spec.parts() * blocks * blockSize
	if c.separateV {
		rows /= 2
	}
	fill := func() [][]byte {
		bufs := make([][]byte, spec.Layers)
		for l := range bufs {
			bufs[l] = make([]byte, rows*spec.RowBytes())
			for i := range bufs[l] {
				bufs[l][i] = byte(rng.Uint32())
			}
		}
		return bufs
	}
	p.Layers = fill()
	if c.separateV {
		p.V = fill()
	}
	return p
}

// clonePaged deep-copies the buffers of p.
func clonePaged(p Paged) Paged {
	c := p
	c.Layers = make([][]byte, len(p.Layers))
	for l := range p.Layers {
		c.Layers[l] = bytes.Clone(p.Layers[l])
	}
	if p.V != nil {
		c.V = make([][]byte, len(p.V))
		for l := range p.V {
			c.V[l] = bytes.Clone(p.V[l])
		}
	}
	return c
}

func pagedEqual(a, b Paged) bool {
	for l := range a.Layers {
		if !bytes.Equal(a.Layers[l], b.Layers[l]) {
			return false
		}
	}
	for l := range a.V {
		if !bytes.Equal(a.V[l], b.V[l]) {
			return false
		}
	}
	return true
}

// refPagedRow returns the row of one slot written directly from the shapes
// in the PagedKind docs, independently of the package's addressing code.
func refPagedRow(spec Spec, p Paged, layer int, part Part, slot int) []byte {
	row := spec.RowBytes()
	block, off := slot/p.BlockSize, slot%p.BlockSize
	buf, index := p.Layers[layer], 0
	switch {
	case p.Kind == PagedBlockFirst: // [blocks, 2, block_size, ...]
		index = (block*2+int(part))*p.BlockSize + off
	case p.V != nil: // K and V each [blocks, block_size, ...]
		if part == V {
			buf = p.V[layer]
		}
		index = block*p.BlockSize + off
	default: // [2, blocks, block_size, ...] or MLA [blocks, block_size, dim]
		index = (int(part)*p.Blocks+block)*p.BlockSize + off
	}
	return buf[index*row : (index+1)*row]
}

// refChunkRow returns where token t of one layer's K or V sits in a chunk,
// using the formulas of the package doc.
func refChunkRow(spec Spec, chunk []byte, tokens, layer int, part Part, t int) []byte {
	L, row, kv := spec.Layers, spec.RowBytes(), int(part)
	var index int
	switch spec.Layout {
	case Layout2LTD: // [2, L, T, H]
		index = (kv*L+layer)*tokens + t
	case Layout2TD: // [L, 2, T, H]
		index = (layer*2+kv)*tokens + t
	case LayoutT2D: // [L, T, 2, H]
		index = (layer*tokens+t)*2 + kv
	case LayoutMLA: // [1, L, T, D]
		index = layer*tokens + t
	}
	return chunk[index*row : (index+1)*row]
}

// refGather builds the chunk Gather must produce, row by row.
func refGather[S Slot](spec Spec, p Paged, slots []S) []byte {
	chunk := make([]byte, spec.ChunkBytes(len(slots)))
	for l := range spec.Layers {
		for part := range Part(spec.parts()) {
			for t, s := range slots {
				copy(refChunkRow(spec, chunk, len(slots), l, part, t), refPagedRow(spec, p, l, part, int(s)))
			}
		}
	}
	return chunk
}

// slotPatterns returns slot mappings of the kinds engines produce, for a
// paged buffer of the given geometry.
func slotPatterns(rng *rand.Rand, blockSize, blocks, maxTokens int) map[string][]int64 {
	capacity := blockSize * blocks
	// A shuffled block table filled in token order, the common case:
	// runs of blockSize consecutive slots, the last block partial.
	table := rng.Perm(blocks)
	var blockTable []int64
	for i := 0; len(blockTable) < maxTokens-1; i++ {
		blockTable = append(blockTable, int64(table[i/blockSize]*blockSize+i%blockSize))
	}
	// Distinct slots in random order: almost no runs.
	random := make([]int64, maxTokens)
	for i, s := range rng.Perm(capacity)[:maxTokens] {
		random[i] = int64(s)
	}
	// One long run that starts mid-block and crosses block boundaries.
	crossing := make([]int64, maxTokens)
	for i := range crossing {
		crossing[i] = int64(blockSize/2 + 1 + i)
	}
	return map[string][]int64{
		"block table": blockTable,
		"random":      random,
		"crossing":    crossing,
		"one token":   {int64(capacity - 1)},
		"last slots":  {int64(capacity - 2), int64(capacity - 1)},
		"prefix":      random[:5],
	}
}

func convertSlots[S Slot](slots []int64) []S {
	out := make([]S, len(slots))
	for i, s := range slots {
		out[i] = S(s)
	}
	return out
}

// TestRoundTrip gathers selected slots, checks the chunk against the
// reference, scatters it into a different paged buffer and checks that
// exactly the selected rows changed, to the original values.
func TestRoundTrip(t *testing.T) {
	for _, c := range layoutCases {
		t.Run(c.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(c.layout)<<8|uint64(c.kind)))
			spec := testSpec(c.layout)
			const blockSize, blocks = 4, 10
			for name, slots := range slotPatterns(rng, blockSize, blocks, spec.ChunkTokens) {
				t.Run(name+"/int64", func(t *testing.T) { roundTrip(t, rng, spec, c, slots) })
				t.Run(name+"/int32", func(t *testing.T) { roundTrip(t, rng, spec, c, convertSlots[int32](slots)) })
				t.Run(name+"/int", func(t *testing.T) { roundTrip(t, rng, spec, c, convertSlots[int](slots)) })
			}
		})
	}
}

func roundTrip[S Slot](t *testing.T, rng *rand.Rand, spec Spec, c layoutCase, slots []S) {
	src := newPaged(rng, spec, c, 4, 10)
	srcBefore := clonePaged(src)
	chunk := make([]byte, spec.ChunkBytes(len(slots)))
	if err := Gather(chunk, spec, src, slots); err != nil {
		t.Fatal(err)
	}
	if want := refGather(spec, src, slots); !bytes.Equal(chunk, want) {
		t.Fatalf("Gather differs from the reference layout")
	}
	if !pagedEqual(src, srcBefore) {
		t.Fatalf("Gather modified the paged buffer")
	}

	dst := newPaged(rng, spec, c, 4, 10)
	want := clonePaged(dst)
	for l := range spec.Layers {
		for part := range Part(spec.parts()) {
			for _, s := range slots {
				copy(refPagedRow(spec, want, l, part, int(s)), refPagedRow(spec, src, l, part, int(s)))
			}
		}
	}
	chunkBefore := bytes.Clone(chunk)
	if err := Scatter(chunk, spec, dst, slots); err != nil {
		t.Fatal(err)
	}
	if !pagedEqual(dst, want) {
		t.Fatalf("Scatter did not reproduce exactly the selected rows")
	}
	if !bytes.Equal(chunk, chunkBefore) {
		t.Fatalf("Scatter modified the chunk")
	}
}

// TestPerLayer checks that GatherLayer writes exactly one layer's part of
// the chunk, that all layers together equal Gather, and likewise for
// ScatterLayer and Scatter.
func TestPerLayer(t *testing.T) {
	for _, c := range layoutCases {
		t.Run(c.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(2, uint64(c.layout)<<8|uint64(c.kind)))
			spec := testSpec(c.layout)
			slots := slotPatterns(rng, 4, 10, spec.ChunkTokens)["block table"]
			tokens := len(slots)
			paged := newPaged(rng, spec, c, 4, 10)

			full := make([]byte, spec.ChunkBytes(tokens))
			if err := Gather(full, spec, paged, slots); err != nil {
				t.Fatal(err)
			}
			layered := make([]byte, len(full))
			for l := range spec.Layers {
				one := bytes.Repeat([]byte{0xAA}, len(full))
				if err := GatherLayer(one, spec, paged, l, slots); err != nil {
					t.Fatal(err)
				}
				// Mark layer l's bytes in a mask from the reference layout.
				mask := make([]byte, len(full))
				for part := range Part(spec.parts()) {
					for tok := range tokens {
						row := refChunkRow(spec, mask, tokens, l, part, tok)
						for i := range row {
							row[i] = 1
						}
					}
				}
				for i := range one {
					if mask[i] == 1 && one[i] != full[i] {
						t.Fatalf("layer %d: byte %d = %#x, Gather wrote %#x", l, i, one[i], full[i])
					}
					if mask[i] == 0 && one[i] != 0xAA {
						t.Fatalf("layer %d: byte %d belongs to another layer but was written", l, i)
					}
				}
				if err := GatherLayer(layered, spec, paged, l, slots); err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(layered, full) {
				t.Fatalf("GatherLayer over every layer differs from Gather")
			}

			whole := newPaged(rng, spec, c, 4, 10)
			perLayer := clonePaged(whole)
			if err := Scatter(full, spec, whole, slots); err != nil {
				t.Fatal(err)
			}
			for l := range spec.Layers {
				before := clonePaged(perLayer)
				if err := ScatterLayer(full, spec, perLayer, l, slots); err != nil {
					t.Fatal(err)
				}
				for other := range spec.Layers {
					changed := !bytes.Equal(before.Layers[other], perLayer.Layers[other])
					if perLayer.V != nil {
						changed = changed || !bytes.Equal(before.V[other], perLayer.V[other])
					}
					if other != l && changed {
						t.Fatalf("ScatterLayer(%d) changed layer %d", l, other)
					}
				}
			}
			if !pagedEqual(whole, perLayer) {
				t.Fatalf("ScatterLayer over every layer differs from Scatter")
			}
		})
	}
}

// TestScatterDuplicateSlot pins the documented rule: the later token wins.
func TestScatterDuplicateSlot(t *testing.T) {
	spec := Spec{Layers: 1, KVHeads: 1, HeadDim: 1, DType: Uint8, Layout: Layout2LTD, ChunkTokens: 4}
	paged := Paged{Kind: PagedSplit, BlockSize: 2, Blocks: 2, Layers: [][]byte{make([]byte, 8)}}
	chunk := []byte{1, 2, 3, 4, 5, 6} // K of tokens 0..2, then V
	if err := Scatter(chunk, spec, paged, []int32{3, 3, 0}); err != nil {
		t.Fatal(err)
	}
	if want := []byte{3, 0, 0, 2, 6, 0, 0, 5}; !bytes.Equal(paged.Layers[0], want) {
		t.Errorf("paged = %v, want %v", paged.Layers[0], want)
	}
}

func TestEmptySlots(t *testing.T) {
	spec := testSpec(Layout2LTD)
	paged := newPaged(rand.New(rand.NewPCG(3, 3)), spec, layoutCases[0], 4, 10)
	if err := Gather(nil, spec, paged, []int64{}); err != nil {
		t.Errorf("Gather of no slots = %v", err)
	}
	if err := ScatterLayer([]byte{}, spec, paged, 2, []int32(nil)); err != nil {
		t.Errorf("ScatterLayer of no slots = %v", err)
	}
}

func TestTransferErrors(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	spec := testSpec(Layout2LTD)
	good := newPaged(rng, spec, layoutCases[0], 4, 10)
	slots := []int64{0, 1, 2, 3, 8, 9}
	chunkFor := func(n int) []byte { return make([]byte, spec.ChunkBytes(n)) }
	edit := func(f func(p *Paged)) Paged { p := clonePaged(good); f(&p); return p }
	mla := testSpec(LayoutMLA)

	cases := []struct {
		name  string
		chunk []byte
		spec  Spec
		paged Paged
		layer int
		slots []int64
		want  error
	}{
		{"negative slot", chunkFor(6), spec, good, allLayers, []int64{0, 1, 2, 3, 8, -1}, ErrSlot},
		{"slot past the end", chunkFor(6), spec, good, allLayers, []int64{0, 1, 2, 3, 8, 40}, ErrSlot},
		{"huge slot", chunkFor(2), spec, good, allLayers, []int64{1 << 40, 0}, ErrSlot},
		{"short chunk", chunkFor(6)[1:], spec, good, allLayers, slots, ErrSize},
		{"long chunk", chunkFor(7), spec, good, allLayers, slots, ErrSize},
		{"nil chunk", nil, spec, good, allLayers, slots, ErrSize},
		{"too many slots", chunkFor(17), spec, good, allLayers, make([]int64, 17), ErrArgument},
		{"layer -2", chunkFor(6), spec, good, -2, slots, ErrArgument},
		{"layer 3", chunkFor(6), spec, good, 3, slots, ErrArgument},
		{"invalid spec", chunkFor(6), Spec{}, good, allLayers, slots, ErrSpec},
		{"missing layer", chunkFor(6), spec, edit(func(p *Paged) { p.Layers = p.Layers[:2] }), allLayers, slots, ErrPaged},
		{"short layer", chunkFor(6), spec, edit(func(p *Paged) { p.Layers[1] = p.Layers[1][:100] }), allLayers, slots, ErrPaged},
		{"long layer", chunkFor(6), spec, edit(func(p *Paged) { p.Layers[2] = append(p.Layers[2], 0) }), allLayers, slots, ErrPaged},
		{"zero block size", chunkFor(6), spec, edit(func(p *Paged) { p.BlockSize = 0 }), allLayers, slots, ErrPaged},
		{"blocks disagree", chunkFor(6), spec, edit(func(p *Paged) { p.Blocks = 9 }), allLayers, slots, ErrPaged},
		{"overflowing blocks", chunkFor(6), spec, edit(func(p *Paged) { p.Blocks = 1 << 62 }), allLayers, slots, ErrPaged},
		{"unknown kind", chunkFor(6), spec, edit(func(p *Paged) { p.Kind = 0 }), allLayers, slots, ErrPaged},
		{"MLA buffer, KV layout", chunkFor(6), spec, edit(func(p *Paged) { p.Kind = PagedMLA }), allLayers, slots, ErrPaged},
		{"KV buffer, MLA layout", make([]byte, mla.ChunkBytes(6)), mla, good, allLayers, slots, ErrPaged},
		{"V buffers for block-first", chunkFor(6), spec, edit(func(p *Paged) { p.Kind = PagedBlockFirst; p.V = p.Layers }), allLayers, slots, ErrPaged},
		{"V buffers of wrong count", chunkFor(6), spec, edit(func(p *Paged) { p.V = p.Layers[:1] }), allLayers, slots, ErrPaged},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			chunk := bytes.Clone(tc.chunk)
			pagedBefore := clonePaged(tc.paged)
			check := func(op string, err error) {
				t.Helper()
				if !errors.Is(err, tc.want) {
					t.Errorf("%s = %v, want %v", op, err, tc.want)
				}
				if !bytes.Equal(chunk, tc.chunk) || !pagedEqual(tc.paged, pagedBefore) {
					t.Errorf("%s wrote to a buffer before failing", op)
				}
			}
			if tc.layer == allLayers {
				check("Gather", Gather(chunk, tc.spec, tc.paged, tc.slots))
				check("Scatter", Scatter(chunk, tc.spec, tc.paged, tc.slots))
				check("GatherLayer(0)", GatherLayer(chunk, tc.spec, tc.paged, 0, tc.slots))
			} else {
				check("GatherLayer", GatherLayer(chunk, tc.spec, tc.paged, tc.layer, tc.slots))
				check("ScatterLayer", ScatterLayer(chunk, tc.spec, tc.paged, tc.layer, tc.slots))
			}
		})
	}
}

func TestZeroAllocations(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for _, c := range []layoutCase{{Layout2LTD, PagedSplit, false}, {LayoutT2D, PagedBlockFirst, false}, {Layout2TD, PagedSplit, true}} {
		spec := testSpec(c.layout)
		paged := newPaged(rng, spec, c, 4, 10)
		slots64 := slotPatterns(rng, 4, 10, spec.ChunkTokens)["block table"]
		slots32 := convertSlots[int32](slots64)
		chunk := make([]byte, spec.ChunkBytes(len(slots64)))
		ops := map[string]func() error{
			"Gather/int64":       func() error { return Gather(chunk, spec, paged, slots64) },
			"Gather/int32":       func() error { return Gather(chunk, spec, paged, slots32) },
			"Scatter/int64":      func() error { return Scatter(chunk, spec, paged, slots64) },
			"Scatter/int32":      func() error { return Scatter(chunk, spec, paged, slots32) },
			"GatherLayer/int64":  func() error { return GatherLayer(chunk, spec, paged, 1, slots64) },
			"ScatterLayer/int32": func() error { return ScatterLayer(chunk, spec, paged, 2, slots32) },
		}
		for name, op := range ops {
			var err error
			if allocs := testing.AllocsPerRun(50, func() { err = op() }); allocs != 0 {
				t.Errorf("%v %s: %v allocations per call, want 0", c, name, allocs)
			}
			if err != nil {
				t.Errorf("%v %s: %v", c, name, err)
			}
		}
	}
}

// FuzzTransfer feeds arbitrary slot mappings and layers to Gather and
// Scatter: they must never panic, and whatever they accept must match the
// reference layout.
func FuzzTransfer(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 9, 8}, uint8(0), int8(-1))
	f.Add([]byte{39, 38, 255, 0}, uint8(9), int8(2))
	f.Add([]byte{}, uint8(4), int8(5))
	f.Fuzz(func(t *testing.T, raw []byte, caseIndex uint8, layer int8) {
		c := layoutCases[int(caseIndex)%len(layoutCases)]
		spec := testSpec(c.layout)
		rng := rand.New(rand.NewPCG(uint64(len(raw)), uint64(caseIndex)))
		paged := newPaged(rng, spec, c, 4, 10)
		slots := make([]int32, len(raw))
		for i, b := range raw {
			slots[i] = int32(int8(b)) // mostly valid, some negative
		}
		chunk := make([]byte, max(0, spec.ChunkBytes(len(slots))))
		var err error
		if layer < 0 {
			err = Gather(chunk, spec, paged, slots)
		} else {
			err = GatherLayer(chunk, spec, paged, int(layer), slots)
		}
		valid := len(slots) <= spec.ChunkTokens && !slices.ContainsFunc(slots, func(s int32) bool { return s < 0 || s >= 40 }) &&
			int(layer) < spec.Layers
		if (err == nil) != valid {
			t.Fatalf("slots %v layer %d: err = %v, valid = %v", slots, layer, err, valid)
		}
		if err == nil && layer < 0 {
			if !bytes.Equal(chunk, refGather(spec, paged, slots)) {
				t.Fatalf("slots %v: Gather differs from the reference", slots)
			}
			if err := Scatter(chunk, spec, paged, slots); err != nil {
				t.Fatalf("Scatter rejected what Gather accepted: %v", err)
			}
		}
	})
}

func ExampleGather() {
	// A toy model: 2 layers, 1 KV head of dim 2, uint8 elements, paged in
	// blocks of 2 tokens, with every byte set to layer*100 + K/V*50 + slot.
	spec := Spec{Layers: 2, KVHeads: 1, HeadDim: 2, DType: Uint8, Layout: Layout2LTD, ChunkTokens: 4}
	paged := Paged{Kind: PagedSplit, BlockSize: 2, Blocks: 4}
	for l := range 2 {
		buf := make([]byte, 2*4*2*2) // [2, blocks, block_size, heads*head_dim]
		for i := range buf {
			kv, slot := i/16, i%16/2
			buf[i] = byte(l*100 + kv*50 + slot)
		}
		paged.Layers = append(paged.Layers, buf)
	}

	slots := []int64{6, 7, 2} // block 3, then block 1
	chunk := make([]byte, spec.ChunkBytes(len(slots)))
	if err := Gather(chunk, spec, paged, slots); err != nil {
		panic(err)
	}
	view, _ := spec.LayerView(chunk, 1)
	fmt.Println("chunk:       ", chunk)
	fmt.Println("layer 1 K, V:", view.K, view.V)
	// Output:
	// chunk:        [6 6 7 7 2 2 106 106 107 107 102 102 56 56 57 57 52 52 156 156 157 157 152 152]
	// layer 1 K, V: [106 106 107 107 102 102] [156 156 157 157 152 152]
}
