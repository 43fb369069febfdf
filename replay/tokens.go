package replay

import "fmt"

// Constants of the hash-id → token mapping described in the package doc.
const (
	// TokenSeed is XORed into a hash id to seed its token stream
	// (the ASCII bytes of "kvtier-1").
	TokenSeed = 0x6B76746965722D31
	// Vocab bounds the token ids: every token is in [0, Vocab).
	Vocab = 128000
)

// splitMix64 is Vigna's SplitMix64 generator: a Weyl sequence through a
// 64-bit finalizer. It is tiny, fast and has published test vectors, so
// the mapping can be reproduced in any language.
type splitMix64 uint64

func (s *splitMix64) next() uint64 {
	*s += 0x9E3779B97F4A7C15
	z := uint64(*s)
	z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
	z = (z ^ z>>27) * 0x94D049BB133111EB
	return z ^ z>>31
}

// BlockTokens appends the first n tokens of hash id's block to dst and
// returns the extended slice. n is BlockSize for a full block and less for
// a partial last block; it panics when n is outside 0..BlockSize, which is
// a caller's bug.
func BlockTokens(id uint64, n int, dst []uint32) []uint32 {
	if n < 0 || n > BlockSize {
		panic(fmt.Sprintf("replay: BlockTokens for %d tokens, want 0..%d", n, BlockSize))
	}
	s := splitMix64(id ^ TokenSeed)
	for range n {
		hi := s.next() >> 32 // top 32 bits, scaled into [0, Vocab) without a modulo
		dst = append(dst, uint32((hi*Vocab)>>32))
	}
	return dst
}
