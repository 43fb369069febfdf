package chunk

import (
	"errors"
	"fmt"

	"github.com/zeebo/xxh3"
)

// DefaultSize is the default number of tokens per chunk, LMCache's default.
const DefaultSize = 256

// Errors returned by this package; the returned errors wrap them with the
// offending values.
var (
	ErrChunkSize = errors.New("chunk: chunk size must be positive")
	ErrSkip      = errors.New("chunk: skip must be a non-negative multiple of the chunk size, at most the token count")
)

// Chunker cuts token sequences of one scope into chunks of a fixed size and
// computes their keys. It holds no mutable state and is safe for concurrent
// use.
type Chunker struct {
	scope      uint64
	seed       Hash
	size       int
	saveUnfull bool
}

// NewChunker returns a Chunker for scope with size tokens per chunk. With
// saveUnfull a trailing chunk shorter than size gets a key too; without it,
// only full chunks are keyed (and stored).
func NewChunker(scope Scope, size int, saveUnfull bool) (*Chunker, error) {
	if size <= 0 {
		return nil, fmt.Errorf("%w: got %d", ErrChunkSize, size)
	}
	return &Chunker{
		scope:      scope.ID(),
		seed:       scope.Seed(),
		size:       size,
		saveUnfull: saveUnfull,
	}, nil
}

// Size returns the number of tokens per chunk.
func (c *Chunker) Size() int { return c.size }

// Scope returns the ID of the chunker's scope, the Scope field of its keys.
func (c *Chunker) Scope() uint64 { return c.scope }

// SaveUnfull reports whether a trailing partial chunk gets a key.
func (c *Chunker) SaveUnfull() bool { return c.saveUnfull }

// NumChunks returns how many keys Keys produces for numTokens tokens: the
// full chunks, plus one for a trailing partial chunk when SaveUnfull is set.
func (c *Chunker) NumChunks(numTokens int) int {
	if numTokens <= 0 {
		return 0
	}
	n := numTokens / c.size
	if c.saveUnfull && numTokens%c.size != 0 {
		n++
	}
	return n
}

// Bounds returns the token range [start, end) of chunk i in a sequence of
// numTokens tokens. i must be in [0, NumChunks(numTokens)); Bounds panics
// otherwise, like an out-of-range slice index.
func (c *Chunker) Bounds(i, numTokens int) (start, end int) {
	if i < 0 || i >= c.NumChunks(numTokens) {
		panic(fmt.Sprintf("chunk: chunk index %d out of range [0, %d) for %d tokens", i, c.NumChunks(numTokens), numTokens))
	}
	start = i * c.size
	return start, min(start+c.size, numTokens)
}

// FirstChunk returns the index of the first chunk to store or retrieve when
// the leading skip tokens of a numTokens-token sequence are already on the
// GPU. skip must be a non-negative multiple of the chunk size and at most
// numTokens. The keys of skipped chunks are still needed (every later key
// chains through them), so callers compute all keys and start at the index
// returned here.
func (c *Chunker) FirstChunk(skip, numTokens int) (int, error) {
	if skip < 0 || skip%c.size != 0 || skip > numTokens {
		return 0, fmt.Errorf("%w: skip %d, chunk size %d, %d tokens", ErrSkip, skip, c.size, numTokens)
	}
	return skip / c.size, nil
}

// Keys appends one key per chunk of tokens to dst and returns the extended
// slice. Chunk i's hash is xxh3-128 over the 16 bytes of chunk i-1's hash
// (the scope's seed for chunk 0) followed by chunk i's token ids as 4-byte
// little-endian values. Keys does not allocate when cap(dst) has room for
// NumChunks(len(tokens)) more keys.
func (c *Chunker) Keys(dst []Key, tokens []uint32) []Key {
	var h xxh3.Hasher128
	var scratch tokenScratch
	parent := c.seed
	for i, n := 0, c.NumChunks(len(tokens)); i < n; i++ {
		start, end := c.Bounds(i, len(tokens))
		parent = chainHash(&h, &scratch, parent, tokens[start:end])
		dst = append(dst, Key{Scope: c.scope, Hash: parent})
	}
	return dst
}

// chainHash returns xxh3-128(parent || little-endian tokens), using h and
// scratch as working space so that the caller can keep both on its stack.
func chainHash(h *xxh3.Hasher128, scratch *tokenScratch, parent Hash, tokens []uint32) Hash {
	h.Reset()
	_, _ = h.Write(parent[:])
	for len(tokens) > 0 {
		var piece []byte
		piece, tokens = nextTokenBytes(tokens, scratch)
		_, _ = h.Write(piece)
	}
	return h.Sum128().Bytes()
}
