package replay

import (
	"context"
	"fmt"
)

// Cache is what Run replays a trace through: a real engine behind kvtier.
type Cache interface {
	// Lookup returns how many leading tokens of the prompt are cached.
	Lookup(tokens []uint32) (hitTokens int, err error)
	// Store caches the prompt's KV.
	Store(tokens []uint32) error
}

// Run replays reqs through cache in order: for each request it builds the
// prompt with BlockTokens, looks it up, then stores it. A block counts as
// a hit when Lookup covered all its tokens (and so every block before it);
// HitTokens is what Lookup reported, which can include part of a block when
// the cache chunks finer than BlockSize. progress, if not nil, is called
// after each request. Run stops at the first error or when ctx is done.
func Run(ctx context.Context, reqs []Request, cache Cache, progress func(done, total int)) (Result, error) {
	res := Result{Policy: "replay", Requests: len(reqs)}
	var tokens []uint32
	for r := range reqs {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("replay: stopped before request %d: %w", r, err)
		}
		req := &reqs[r]
		if err := req.validate(); err != nil {
			return res, fmt.Errorf("replay: request %d: %w", r, err)
		}
		tokens = promptTokens(req, tokens[:0])
		hit, err := cache.Lookup(tokens)
		if err != nil {
			return res, fmt.Errorf("replay: request %d: lookup: %w", r, err)
		}
		hit = min(max(hit, 0), len(tokens))
		res.BlockRefs += len(req.HashIDs)
		res.HitBlocks += blocksWithin(req, hit)
		res.Tokens += int64(len(tokens))
		res.HitTokens += int64(hit)
		if err := cache.Store(tokens); err != nil {
			return res, fmt.Errorf("replay: request %d: store: %w", r, err)
		}
		if progress != nil {
			progress(r+1, len(reqs))
		}
	}
	return res, nil
}

// promptTokens appends the request's prompt, block by block, to dst.
func promptTokens(req *Request, dst []uint32) []uint32 {
	for i, id := range req.HashIDs {
		dst = BlockTokens(id, req.BlockLen(i), dst)
	}
	return dst
}

// blocksWithin counts the request's blocks that lie entirely within its
// first n tokens.
func blocksWithin(req *Request, n int) int {
	full := n / BlockSize
	if n == req.InputLength && full < len(req.HashIDs) {
		return len(req.HashIDs) // the partial last block is covered too
	}
	return full
}
