// Package engine is the one door to kvtier's storage: the daemon's
// protocol server and admin API, the bench and the tests reach the tiers
// and the arena only through it. On tokens, Lookup says how much of a
// prompt's prefix is cached (and in which tier), Store saves chunk bytes,
// Retrieve returns them, and Prefetch pulls a prefix up into RAM ahead of
// use; it turns tokens into chunk keys (package chunk) and delegates
// storage to a tier.Manager. On chunk keys it serves the daemon's
// protocols: the zero-copy PrepareStore/CommitStore and PrepareRetrieve,
// and clear, flush, stats and listing.
//
// The engine owns the leases clients hold on RAM between two requests
// (lease.go): one table, one expiry rule, one reaper. They are the only
// leases in kvtier: the arena counts references and has no deadlines, and
// the RAM tier is pinned only by the references these leases hold.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
)

// Request names the tokens an operation is about.
type Request struct {
	Scope  chunk.Scope // model, parallel layout, KV format and namespace
	Tokens []uint32    // the whole prompt, from its first token
	// Skip is how many leading tokens the caller already holds (on the GPU);
	// they are neither stored nor retrieved. A multiple of the chunk size.
	Skip int
}

// Hit describes a cached prefix.
type Hit struct {
	Tokens int // prefix tokens available, counted from the prompt's start
	Chunks int // chunks covering them
	// ByTier[i] is how many of those tokens tier i (0 = RAM) would serve,
	// and ChunksByTier[i] how many chunks.
	ByTier       [tier.MaxTiers]int
	ChunksByTier [tier.MaxTiers]int
}

// Engine caches KV chunks by token prefix. Safe for concurrent use.
type Engine struct {
	chunkSize  int
	saveUnfull bool
	mgr        *tier.Manager
	arena      *arena.Arena // owned when opened by Open
	namespace  string       // applied to requests that name none
	log        *slog.Logger

	mu       sync.RWMutex
	chunkers map[chunk.Scope]*chunk.Chunker

	keyPool sync.Pool // *[]chunk.Key

	pend pendingTable // chunks pushed layer by layer, still arriving (pending.go)

	specs *scopeSpecs // what scopes' format tags say, for remote codecs and layer geometries

	leases *leaseTable // every lease clients hold, and their reaper
	book   *scopeBook  // scopes clients registered, by id
	quotas *quotas     // tenants' quotas (quota.go); nil for none

	scratch      scratchPool  // buffers of lower-tier ranges (ranges.go)
	rangeHolders atomic.Int64 // RangeReads holding scratch buffers
}

// New returns an engine over mgr that cuts prompts into chunks of
// chunkSize tokens, keeping a trailing partial chunk when saveUnfull.
func New(mgr *tier.Manager, chunkSize int, saveUnfull bool, log *slog.Logger) (*Engine, error) {
	if chunkSize <= 0 {
		return nil, fmt.Errorf("engine: chunk size %d must be positive", chunkSize)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	book := newScopeBook()
	return &Engine{chunkSize: chunkSize, saveUnfull: saveUnfull, mgr: mgr, log: log,
		chunkers: make(map[chunk.Scope]*chunk.Chunker),
		leases:   newLeaseTable(mgr.RAM().Arena()), book: book,
		specs: &scopeSpecs{chunkTokens: chunkSize, book: book}}, nil
}

// ChunkSize returns the number of tokens per chunk.
func (e *Engine) ChunkSize() int { return e.chunkSize }

// Manager returns the tier manager behind the engine, for tests and tools
// that inspect the tiers; the daemon goes through the engine's methods.
func (e *Engine) Manager() *tier.Manager { return e.mgr }

// Arena returns the RAM tier's arena, for tests and tools; the daemon
// goes through the engine's methods.
func (e *Engine) Arena() *arena.Arena { return e.mgr.RAM().Arena() }

// maxCachedScopes bounds the chunker cache. Namespaces (tenants, cache
// salts) arrive with requests, so the set of scopes is unbounded.
const maxCachedScopes = 4096

// Chunker returns the (cached) chunker of scope.
func (e *Engine) Chunker(scope chunk.Scope) (*chunk.Chunker, error) {
	e.mu.RLock()
	c, ok := e.chunkers[scope]
	e.mu.RUnlock()
	if ok {
		return c, nil
	}
	c, err := chunk.NewChunker(scope, e.chunkSize, e.saveUnfull)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	t, tagged := parseScopeTag(scope.Format, e.chunkSize)
	e.mu.Lock()
	if prev, ok := e.chunkers[scope]; ok {
		c = prev
	} else {
		if len(e.chunkers) >= maxCachedScopes {
			clear(e.chunkers) // scopes come from requests: keep the cache bounded
		}
		// The parsed tags are bounded too; when they are cleared so are
		// the chunkers, so that every cached chunker's tag is held (under
		// e.mu, so that no chunker is cached between the two).
		if e.specs.store(c.Scope(), t, tagged) {
			clear(e.chunkers)
		}
		e.chunkers[scope] = c
	}
	e.mu.Unlock()
	return c, nil
}

// keys computes the request's chunk keys into a pooled buffer and returns
// it with the chunker and the index of the first chunk after Skip. The
// caller returns the buffer with e.putKeys.
func (e *Engine) keys(r Request) (*chunk.Chunker, *[]chunk.Key, int, error) {
	kp, _ := e.keyPool.Get().(*[]chunk.Key)
	if kp == nil {
		kp = new([]chunk.Key)
	}
	keys, first, c, err := e.Keys((*kp)[:0], r)
	if err != nil {
		e.keyPool.Put(kp)
		return nil, nil, 0, err
	}
	*kp = keys
	return c, kp, first, nil
}

func (e *Engine) putKeys(kp *[]chunk.Key) { e.keyPool.Put(kp) }

// tokensThrough returns how many tokens chunks [0, n) cover.
func tokensThrough(c *chunk.Chunker, n, numTokens int) int {
	if n == 0 {
		return 0
	}
	_, end := c.Bounds(n-1, numTokens)
	return end
}

// Lookup returns the longest cached prefix of the prompt.
func (e *Engine) Lookup(r Request) (Hit, error) {
	c, kp, _, err := e.keys(r)
	if err != nil {
		return Hit{}, err
	}
	defer e.putKeys(kp)
	n, byChunks, last := e.mgr.Lookup(*kp)
	h := Hit{Chunks: n, Tokens: tokensThrough(c, n, len(r.Tokens)), ChunksByTier: byChunks}
	if n == 0 {
		return h, nil
	}
	for i, cnt := range byChunks {
		h.ByTier[i] = cnt * c.Size()
	}
	h.ByTier[last] -= n*c.Size() - h.Tokens // a partial last chunk is short
	return h, nil
}

// Store saves the chunks after r.Skip: chunks[j] holds the KV bytes of
// chunk FirstChunk+j. It returns how many chunks were stored.
func (e *Engine) Store(ctx context.Context, r Request, chunks [][]byte) (int, error) {
	_, kp, first, err := e.keys(r)
	if err != nil {
		return 0, err
	}
	defer e.putKeys(kp)
	keys := (*kp)[first:]
	if len(chunks) > len(keys) {
		return 0, fmt.Errorf("engine: %d chunk buffers for %d chunks after skip", len(chunks), len(keys))
	}
	if first > 0 { // the chunk before Skip is the first one's parent
		return e.mgr.StoreAfter(ctx, (*kp)[first-1], keys[:len(chunks)], chunks)
	}
	return e.mgr.StoreChain(ctx, keys[:len(chunks)], chunks)
}

// Retrieved says what Retrieve returned.
type Retrieved struct {
	Chunks int // leading chunks after Skip copied into dst
	Tokens int // tokens they cover
}

// Retrieve copies the cached chunks after r.Skip into dst, in order,
// stopping at the first chunk that is not cached (the hit mask is always a
// prefix). dst[j] is resliced to chunk j's length.
func (e *Engine) Retrieve(ctx context.Context, r Request, dst [][]byte) (Retrieved, error) {
	c, kp, first, err := e.keys(r)
	if err != nil {
		return Retrieved{}, err
	}
	defer e.putKeys(kp)
	keys := (*kp)[first:]
	if len(dst) < len(keys) {
		keys = keys[:len(dst)]
	}
	n, err := e.mgr.Retrieve(ctx, keys, dst)
	got := Retrieved{Chunks: n}
	if n > 0 {
		got.Tokens = tokensThrough(c, first+n, len(r.Tokens)) - r.Skip
	}
	return got, err
}

// Prefetch asks for the prompt's chunks after r.Skip to be promoted into
// RAM in the background. It never blocks and reports whether it was queued.
func (e *Engine) Prefetch(r Request) (bool, error) {
	_, kp, first, err := e.keys(r)
	if err != nil {
		return false, err
	}
	defer e.putKeys(kp)
	return e.mgr.Prefetch((*kp)[first:]), nil
}

// Close ends every lease, then closes the manager and its tiers, and the
// arena if Open made it.
func (e *Engine) Close() error {
	if e.mgr == nil {
		return errors.New("engine: not open")
	}
	e.leases.close()
	return e.closeAll()
}

// Keys appends the chunk keys of r's whole prompt to dst and returns them,
// with the index of the first chunk after r.Skip and the chunker that cut
// them (for Chunker.Bounds). It is for callers that drive the manager
// themselves, like the daemon's zero-copy protocol.
func (e *Engine) Keys(dst []chunk.Key, r Request) ([]chunk.Key, int, *chunk.Chunker, error) {
	c, err := e.Chunker(e.scoped(r.Scope))
	if err != nil {
		return dst, 0, nil, err
	}
	first, err := c.FirstChunk(r.Skip, len(r.Tokens))
	if err != nil {
		return dst, 0, nil, fmt.Errorf("engine: %w", err)
	}
	return c.Keys(dst, r.Tokens), first, c, nil
}

// scoped applies the engine's default namespace to a scope that names none.
func (e *Engine) scoped(s chunk.Scope) chunk.Scope {
	if s.Namespace == "" {
		s.Namespace = e.namespace
	}
	return s
}

// TokensThrough returns how many tokens the first n chunks of a prompt of
// numTokens tokens cover.
func TokensThrough(c *chunk.Chunker, n, numTokens int) int { return tokensThrough(c, n, numTokens) }

// ScopeID returns the id chunk keys of scope carry, after the engine's
// default namespace is applied as it is for requests.
func (e *Engine) ScopeID(scope chunk.Scope) (uint64, error) {
	c, err := e.ScopeChunker(scope)
	if err != nil {
		return 0, err
	}
	return c.Scope(), nil
}

// ScopeChunker returns the chunker Keys uses for requests of scope (with
// the engine's default namespace applied). A Chunker never changes, so a
// caller that serves many requests of one scope may keep it.
func (e *Engine) ScopeChunker(scope chunk.Scope) (*chunk.Chunker, error) {
	return e.Chunker(e.scoped(scope))
}
