package chunk

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// Hash is a 128-bit chunk hash. It is chained: a chunk's hash covers its own
// tokens and, through its parent's hash, every token before it.
type Hash [16]byte

// String returns the hash as 32 lowercase hex digits.
func (h Hash) String() string { return hex.EncodeToString(h[:]) }

// Scope says which KV a chunk belongs to. Chunks never match across scopes:
// two requests share a key only when they share model, parallel layout, KV
// format, namespace and every token up to and including the chunk.
type Scope struct {
	Model     string // model name as the engine reports it
	WorldSize int    // tensor/pipeline parallel world size
	Rank      int    // this worker's rank within WorldSize
	Format    string // KV dtype and layout tag, e.g. "bfloat16/KV_2LTD"
	Namespace string // tenant or cache_salt; empty means shared
}

// Key names one chunk in every tier. It is a small comparable value with no
// pointers, so indexes keyed by it cost the garbage collector nothing.
type Key struct {
	Scope uint64 // Scope.ID() of the chunk's scope
	Hash  Hash   // chained hash of the chunk, seeded by the scope
}

// String returns "scope-hex/hash-hex".
func (k Key) String() string { return fmt.Sprintf("%016x/%s", k.Scope, k.Hash) }

// Index returns the chunk's 64-bit key in the cluster's block index, the
// one index (router/index) that routing and peer-to-peer lookups share:
// daemons report their chunks under it and peers look chunks up by it.
//
// It is the first 8 bytes of the hash, big-endian, XORed with the scope
// mixed by splitmix64's finalizer. The hash is already seeded by the
// scope, so the scope term only guards keys whose hash came from outside
// (engine-native hashes, identical across scopes). The hash bits are
// uniform, so among n distinct chunks the chance that any two share an
// index key is about n²/2⁶⁵: 3·10⁻⁸ for a million chunks, 3·10⁻⁶ for ten
// million. A collision makes a lookup name a holder that then misses,
// never wrong bytes: peers fetch by the full Key.
func (k Key) Index() uint64 {
	return binary.BigEndian.Uint64(k.Hash[:8]) ^ mixScope(k.Scope)
}

// mixScope is splitmix64's finalizer: it spreads a scope id's bits over
// the whole word so that related scopes do not cancel hash bits in Index.
func mixScope(s uint64) uint64 {
	s ^= s >> 30
	s *= 0xbf58476d1ce4e5b9
	s ^= s >> 27
	s *= 0x94d049bb133111eb
	s ^= s >> 31
	return s
}
