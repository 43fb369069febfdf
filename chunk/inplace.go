package chunk

import (
	"fmt"
	"slices"

	"github.com/zeebo/xxh3"
)

// HashSize is the size of a chunk hash, and the room KeysInPlace needs
// before the tokens.
const HashSize = len(Hash{})

// KeysInPlace appends to dst the keys of the tokens in buf[HashSize:],
// given as 4-byte little-endian ids (as the cache protocol carries them),
// and returns the extended slice: the same keys Keys returns for those
// tokens. It hashes every chunk where it lies, without copying or
// converting a token. A chunk's hash input is its parent's hash followed
// by its tokens, so the HashSize bytes just before the chunk — buf's first
// HashSize bytes for chunk 0, the end of the previous chunk's tokens for
// the others — are replaced by the parent's hash for the one call to
// xxh3 and put back right after it. On return buf holds what it held on
// entry; during the call nobody else may read or write it, and it must be
// writable memory.
//
// It panics if len(buf) is less than HashSize or len(buf)-HashSize is not
// a multiple of 4. Like Keys it allocates nothing when cap(dst) has room.
func (c *Chunker) KeysInPlace(dst []Key, buf []byte) []Key {
	if len(buf) < HashSize || (len(buf)-HashSize)%4 != 0 {
		panic(fmt.Sprintf("chunk: KeysInPlace of %d bytes: want %d bytes of room and whole 4-byte tokens", len(buf), HashSize))
	}
	numTokens := (len(buf) - HashSize) / 4
	n := c.NumChunks(numTokens)
	at := len(dst)
	dst = slices.Grow(dst, n)[:at+n]
	parent := c.seed
	step := 4 * c.size
	for i := range n {
		// Chunk i's input: HashSize bytes of room, then its tokens.
		in := buf[i*step : min((i+1)*step, len(buf)-HashSize)+HashSize]
		saved := Hash(in[:HashSize])
		*(*Hash)(in) = parent
		parent = xxh3.Hash128(in).Bytes()
		*(*Hash)(in) = saved
		dst[at+i] = Key{Scope: c.scope, Hash: parent}
	}
	return dst
}

// KeysOfBytes is KeysInPlace for tokens that must not be written, such as
// a read-only mapping: tokens holds only the ids' little-endian bytes, and
// each chunk is copied behind its parent's hash into scratch (grown to
// one chunk's input, HashSize + 4 × Size bytes, and returned for reuse)
// before it is hashed. It panics if len(tokens) is not a multiple of 4.
func (c *Chunker) KeysOfBytes(dst []Key, tokens []byte, scratch []byte) ([]Key, []byte) {
	if len(tokens)%4 != 0 {
		panic(fmt.Sprintf("chunk: KeysOfBytes of %d bytes: want whole 4-byte tokens", len(tokens)))
	}
	if need := HashSize + 4*c.size; cap(scratch) < need {
		scratch = make([]byte, need)
	}
	n := c.NumChunks(len(tokens) / 4)
	at := len(dst)
	dst = slices.Grow(dst, n)[:at+n]
	parent := c.seed
	step := 4 * c.size
	for i := range n {
		piece := tokens[i*step : min((i+1)*step, len(tokens))]
		in := scratch[:HashSize+len(piece)]
		*(*Hash)(in) = parent
		copy(in[HashSize:], piece)
		parent = xxh3.Hash128(in).Bytes()
		dst[at+i] = Key{Scope: c.scope, Hash: parent}
	}
	return dst, scratch
}
