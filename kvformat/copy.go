package kvformat

import "fmt"

// Slot is the integer type of a slot mapping. vLLM and SGLang hand
// connectors int64 tensors; int32 tables are accepted as well, so neither
// needs converting (which would allocate).
type Slot interface{ ~int | ~int32 | ~int64 }

// Gather copies the KV of the tokens at slots, for every layer, out of the
// paged buffer into chunk, in spec.Layout. Token i of the chunk is
// slots[i]. chunk must be exactly spec.ChunkBytes(len(slots)) bytes and
// len(slots) at most spec.ChunkTokens. Nothing is written unless every
// argument checks out; no heap allocation is made unless an error is
// returned.
func Gather[S Slot](chunk []byte, spec Spec, paged Paged, slots []S) error {
	return transfer(chunk, spec, paged, slots, allLayers, toChunk)
}

// Scatter is the inverse of Gather: it copies token i of chunk into slot
// slots[i] of the paged buffer, for every layer. Rows of slots not listed
// are left untouched. If a slot is listed twice, the later token wins.
func Scatter[S Slot](chunk []byte, spec Spec, paged Paged, slots []S) error {
	return transfer(chunk, spec, paged, slots, allLayers, toPaged)
}

// GatherLayer is Gather restricted to one layer: it writes only that
// layer's part of chunk (the whole chunk buffer, same size as for Gather),
// so calling it for every layer produces exactly what Gather does.
func GatherLayer[S Slot](chunk []byte, spec Spec, paged Paged, layer int, slots []S) error {
	return transfer(chunk, spec, paged, slots, layer, toChunk)
}

// ScatterLayer is Scatter restricted to one layer, for layerwise loading:
// a connector can scatter layer l while the engine computes layer l-1.
// chunk is the whole chunk, as for Scatter.
func ScatterLayer[S Slot](chunk []byte, spec Spec, paged Paged, layer int, slots []S) error {
	return transfer(chunk, spec, paged, slots, layer, toPaged)
}

// direction says which way transfer copies.
type direction bool

const (
	toChunk direction = true  // gather: paged → chunk
	toPaged direction = false // scatter: chunk → paged
)

// allLayers asks transfer for every layer.
const allLayers = -1

// transfer checks every argument, then copies the layers asked for.
func transfer[S Slot](chunk []byte, spec Spec, paged Paged, slots []S, layer int, dir direction) error {
	if err := checkTransfer(len(chunk), spec, paged, layer); err != nil {
		return err
	}
	tokens := len(slots)
	if tokens > spec.ChunkTokens {
		return fmt.Errorf("%w: %d slots, a chunk holds at most %d tokens", ErrArgument, tokens, spec.ChunkTokens)
	}
	if want := spec.ChunkBytes(tokens); len(chunk) != want {
		return fmt.Errorf("%w: chunk is %d bytes, %d tokens of %v need %d", ErrSize, len(chunk), tokens, spec.Tag(), want)
	}
	if err := checkSlots(slots, paged.slots()); err != nil {
		return err
	}
	first, end := 0, spec.Layers
	if layer != allLayers {
		first, end = layer, layer+1
	}
	for l := first; l < end; l++ {
		for part := range Part(spec.parts()) {
			copyPlane(chunk, spec, paged, l, part, slots, dir)
		}
	}
	return nil
}

// checkTransfer holds the checks that do not depend on the slot type, so
// they are compiled once rather than once per Slot instantiation.
func checkTransfer(chunkLen int, spec Spec, paged Paged, layer int) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	if err := paged.check(spec); err != nil {
		return err
	}
	if layer != allLayers && (layer < 0 || layer >= spec.Layers) {
		return fmt.Errorf("%w: layer %d, want 0..%d", ErrArgument, layer, spec.Layers-1)
	}
	return nil
}

// checkSlots rejects any slot outside 0..capacity-1.
func checkSlots[S Slot](slots []S, capacity int) error {
	for i, s := range slots {
		if int64(s) < 0 || int64(s) >= int64(capacity) {
			return fmt.Errorf("%w: slots[%d] = %d, the paged buffer has slots 0..%d", ErrSlot, i, int64(s), capacity-1)
		}
	}
	return nil
}

// copyPlane moves one layer's K or V rows between chunk and paged. It
// finds runs of consecutive slots whose rows are adjacent in the paged
// buffer and, where the chunk side is contiguous too (every layout but
// KV_T2D), moves each run with a single copy. Arguments must be checked.
func copyPlane[S Slot](chunk []byte, spec Spec, paged Paged, layer int, part Part, slots []S, dir direction) {
	row := spec.RowBytes()
	bs := paged.BlockSize
	buf, pagedBase, blockStride := paged.pagedPlane(spec, layer, part)
	chunkBase, chunkStride := spec.placement(len(slots), layer, part)
	// When blocks follow each other directly, a run may cross into the
	// next block; otherwise (block-first) it must stop at the block's end.
	acrossBlocks := blockStride == bs*row

	for i := 0; i < len(slots); {
		first := int(slots[i])
		n := 1
		for i+n < len(slots) && int(slots[i+n]) == first+n && (acrossBlocks || (first+n)%bs != 0) {
			n++
		}
		p := pagedBase + (first/bs)*blockStride + (first%bs)*row
		c := chunkBase + i*chunkStride
		if chunkStride == row {
			move(chunk[c:c+n*row], buf[p:p+n*row], dir)
		} else {
			for k := range n {
				move(chunk[c+k*chunkStride:c+k*chunkStride+row], buf[p+k*row:p+(k+1)*row], dir)
			}
		}
		i += n
	}
}

// move copies between a chunk region and a paged region of equal length.
func move(chunk, paged []byte, dir direction) {
	if dir == toChunk {
		copy(chunk, paged)
	} else {
		copy(paged, chunk)
	}
}
