package chunk

import (
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
