package client

import (
	"context"
	"fmt"

	"kvtier/wire"
)

// LookupBatch looks up several prompts in one round trip (LOOKUP_BATCH,
// at most wire.MaxBatch): result i answers lookups[i] as Lookup would
// have, and a lookup that failed has its status and message in its result
// (Err) while the others are answered. The results are valid until the
// next call.
func (c *Client) LookupBatch(ctx context.Context, lookups []wire.Lookup) ([]wire.LookupResult, error) {
	if len(lookups) == 0 || len(lookups) > wire.MaxBatch {
		return nil, fmt.Errorf("kvtier client: a batch of %d lookups; 1 to %d are allowed", len(lookups), wire.MaxBatch)
	}
	b, err := c.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer c.end()
	c.gather.Reset()
	if c.reqTokens == nil {
		b = (&wire.LookupBatch{Lookups: lookups}).AppendGather(b, &c.gather)
	} else {
		// The lookups whose tokens fit in the request buffer name them
		// there; the rest carry theirs in the frame.
		c.shared = append(c.shared[:0], lookups...)
		at := 0
		for i := range c.shared {
			at = c.shareTokens(&c.shared[i].Keys, at)
		}
		b = (&wire.LookupBatch{Lookups: c.shared}).AppendGather(b, &c.gather)
		clear(c.shared) // not kept past the call: they hold the caller's slices
	}
	_, body, err := c.roundTripGather(b, wire.OpLookupBatch, c.peerFlag())
	if err != nil {
		return nil, err
	}
	if err := c.batchReply.Decode(body); err != nil {
		return nil, c.breakConn(err)
	}
	if len(c.batchReply.Results) != len(lookups) {
		return nil, c.breakConn(fmt.Errorf("LOOKUP_BATCH of %d lookups answered with %d results", len(lookups), len(c.batchReply.Results)))
	}
	return c.batchReply.Results, nil
}

// ResultErr is the error of a failed lookup of a batch as a StatusError,
// nil for one that was answered.
func ResultErr(r *wire.LookupResult) error {
	if r.Status == wire.StatusOK {
		return nil
	}
	return &StatusError{Op: wire.OpLookup, Status: r.Status, Message: r.Message}
}
