package chunk

import (
	"encoding/binary"
	"unsafe"
)

// nativeLittleEndian reports whether uint32 values are already stored as
// little-endian bytes, which is the order every hash in this package uses
// for token ids. It lets the common machines hash token slices in place.
var nativeLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// tokenBatch is how many tokens the portable path converts per step. It
// bounds the stack scratch buffer the conversion needs.
const tokenBatch = 256

// tokenScratch holds one batch of tokens encoded as little-endian bytes.
type tokenScratch [tokenBatch * 4]byte

// nextTokenBytes returns the next piece of tokens as little-endian bytes and
// the tokens still to be consumed. Callers loop until rest is empty, feeding
// each piece to their hash. On little-endian machines the piece is all of
// tokens, viewed in place; elsewhere it is at most tokenBatch tokens encoded
// into scratch, so the piece is valid only until the next call.
func nextTokenBytes(tokens []uint32, scratch *tokenScratch) (piece []byte, rest []uint32) {
	if nativeLittleEndian {
		return viewTokenBytes(tokens), nil
	}
	return encodeTokenBytes(tokens, scratch)
}

// viewTokenBytes reinterprets tokens as bytes without copying. The bytes are
// little-endian only on little-endian machines.
func viewTokenBytes(tokens []uint32) []byte {
	if len(tokens) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), len(tokens)*4)
}

// encodeTokenBytes encodes up to tokenBatch tokens into scratch as
// little-endian bytes. It is correct on every machine.
func encodeTokenBytes(tokens []uint32, scratch *tokenScratch) (piece []byte, rest []uint32) {
	n := min(len(tokens), tokenBatch)
	for i, t := range tokens[:n] {
		binary.LittleEndian.PutUint32(scratch[i*4:], t)
	}
	return scratch[:n*4], tokens[n:]
}

// appendTokenBytes appends tokens to dst as 4-byte little-endian values.
func appendTokenBytes(dst []byte, tokens []uint32) []byte {
	if nativeLittleEndian {
		return append(dst, viewTokenBytes(tokens)...)
	}
	for _, t := range tokens {
		dst = binary.LittleEndian.AppendUint32(dst, t)
	}
	return dst
}
