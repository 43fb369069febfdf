package tokenize

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/zeebo/xxh3"
)

// PoolOptions configures a Pool; the zero value gives the defaults.
type PoolOptions struct {
	// Workers bounds concurrent encodes; 0 means GOMAXPROCS.
	Workers int
	// CacheBytes bounds the prefix cache; 0 means 64 MiB, negative turns the
	// cache off.
	CacheBytes int64
	// Segment is the least length of a cached segment in bytes; 0 means 512.
	// Shorter segments find more shared prefix at the cost of more lookups.
	Segment int
}

// PoolStats counts prefix cache activity.
type PoolStats struct {
	SegmentHits   uint64 // segments served from the cache
	SegmentMisses uint64 // segments tokenized (and then cached)
	Entries       int    // segments held
	Bytes         int64  // bytes held, as accounted against CacheBytes
}

// Pool encodes prompts with a bounded number of concurrent encoders and
// serves repeated prefixes from a cache. It is safe for concurrent use.
type Pool struct {
	tok     Tokenizer
	cut     cutter // nil: the tokenizer cannot be cut, cache unused
	slots   chan struct{}
	cache   *segmentCache
	segment int
	hits    atomic.Uint64
	misses  atomic.Uint64
}

var hasherPool = sync.Pool{New: func() any { return xxh3.New() }}

// NewPool wraps tok. The prefix cache is used only with this package's
// tokenizers, which know where text can be cut safely (not, for instance, a
// tokenizer.json whose pre-tokenizer keeps each segment whole).
func NewPool(tok Tokenizer, opts PoolOptions) *Pool {
	if opts.Workers <= 0 {
		opts.Workers = runtime.GOMAXPROCS(0)
	}
	if opts.CacheBytes == 0 {
		opts.CacheBytes = 64 << 20
	}
	if opts.Segment <= 0 {
		opts.Segment = 512
	}
	p := &Pool{tok: tok, slots: make(chan struct{}, opts.Workers), segment: opts.Segment}
	if c, ok := tok.(cutter); ok && c.cuttable() && opts.CacheBytes > 0 {
		p.cut = c
		p.cache = newSegmentCache(opts.CacheBytes)
	}
	return p
}

// Tokenizer returns the wrapped tokenizer.
func (p *Pool) Tokenizer() Tokenizer { return p.tok }

// Encode appends the ids of text to dst, waiting for a free encoder slot
// until ctx is done. The result is identical to the tokenizer's own Encode.
func (p *Pool) Encode(ctx context.Context, text string, dst []uint32) ([]uint32, error) {
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return dst, fmt.Errorf("tokenize: waiting for an encoder: %w", ctx.Err())
	}
	defer func() { <-p.slots }()
	if p.cache == nil {
		return p.tok.Encode(text, dst)
	}
	return p.encodeCached(text, dst)
}

// encodeCached walks the text's segments in order: while their keys are
// cached the tokens are copied, from the first miss on each segment is
// tokenized on its own (valid because segments end at safe cuts) and cached.
// The tail after the last cut is always tokenized and never cached.
func (p *Pool) encodeCached(text string, dst []uint32) ([]uint32, error) {
	h := hasherPool.Get().(*xxh3.Hasher)
	defer hasherPool.Put(h)
	h.Reset()
	start, hitting := 0, true
	for {
		end := p.nextCut(text, start)
		if end < 0 {
			break
		}
		_, _ = h.WriteString(text[start:end])
		key := segmentKey{hash: h.Sum64(), length: end}
		if hitting {
			if tokens, ok := p.cache.get(key); ok {
				p.hits.Add(1)
				dst = append(dst, tokens...)
				start = end
				continue
			}
			hitting = false
		}
		n := len(dst)
		var err error
		if dst, err = p.tok.Encode(text[start:end], dst); err != nil {
			return dst, err
		}
		p.misses.Add(1)
		p.cache.put(key, dst[n:])
		start = end
	}
	return p.tok.Encode(text[start:], dst)
}

// nextCut returns the first safe cut at least p.segment bytes after start,
// or -1. Cuts depend only on the text up to them, so prompts sharing a
// prefix share its cuts and therefore its cache keys.
func (p *Pool) nextCut(text string, start int) int {
	from := start + p.segment
	for from < len(text) {
		i := strings.IndexByte(text[from-1:], '\n')
		if i < 0 {
			return -1
		}
		c := from + i // just after the '\n'
		if p.cut.canCut(text, c) {
			return c
		}
		from = c + 1
	}
	return -1
}

// Stats reports prefix cache activity.
func (p *Pool) Stats() PoolStats {
	s := PoolStats{SegmentHits: p.hits.Load(), SegmentMisses: p.misses.Load()}
	if p.cache != nil {
		s.Entries, s.Bytes = p.cache.stats()
	}
	return s
}
