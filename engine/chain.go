package engine

import (
	"time"

	"kvtier/chunk"
)

// MaxTransferTime is the longest a prefill/decode transfer lasts: a batch
// that comes later than that after the first batch PushChain saw of its
// transfer belongs to another transfer, whatever its ID says. It must be
// no shorter than the server's longest transfer timeout (maxPDTimeout in
// server/pd.go, which a producer's transfer cannot outlive), or a long
// transfer's later batches would start chains of their own; a test in the
// server package checks it (engine cannot import server).
const MaxTransferTime = 10 * time.Minute

// PushChain follows the chunks that one connection receives for a
// prefill/decode transfer (RECEIVE, RECEIVE_LAYERS), so that each can be
// stored as its parent's child (Writes.After). A producer sends a
// transfer's chunks in prompt order, batch after batch on one connection
// (docs/disaggregation.md), so a chunk's parent is the chunk before it in
// its batch, and a batch's first chunk follows the previous batch's last
// one when both belong to the same transfer. The first batch of a
// transfer on a connection names no parent: the connector pushes a
// prompt from its first chunk, which is a root; a producer that pushes
// only a tail leaves that tail's first chunk a root of its own, as every
// pushed chunk was before.
//
// Transfer IDs are the producer's to choose and may come back: the
// producer forgets an ended transfer after ten minutes or 4,096 later
// ones, and a pooled connection outlives both. So a batch follows the
// previous one only when it names the same transfer and comes within
// MaxTransferTime of the first batch of that transfer on the connection;
// otherwise the chain starts again, and the batch's first chunk is a
// root. (A RECEIVE frame names keys, not their positions in the prompt,
// so a batch that starts a prompt cannot be told from one that goes on.)
//
// The window narrows reuse, it does not rule it out: a producer that ends
// 4,096 transfers within MaxTransferTime forgets an ID sooner, and if the
// connector reuses it on the same connection while the window is open,
// the new transfer's first chunk is stored as the old transfer's last
// chunk's child. That costs eviction order only, never bytes: a
// prefix-aware policy keeps the stray parent while the new chain lives.
// Ruling it out takes a frame that says where a prompt starts.
//
// The zero value is ready.
type PushChain struct {
	keys     []chunk.Key // the current batch, for Next
	next     int         // the batch's chunk Next is asked about
	transfer uint64
	start    time.Time // the transfer's first batch on this connection
	last     chunk.Key // the previous batch's last key, for transfer
	first    chunk.Key // the parent of the current batch's first key
	hasLast  bool
	hasFirst bool
	now      func() time.Time // time.Now; tests replace it
}

// Begin starts a batch of keys for transfer. A batch of no keys (a
// RECEIVE_LAYERS probe) changes nothing.
func (c *PushChain) Begin(transfer uint64, keys []chunk.Key) {
	if len(keys) == 0 {
		return
	}
	now := time.Now
	if c.now != nil {
		now = c.now
	}
	t := now()
	follows := c.hasLast && c.transfer == transfer && transfer != 0 && t.Sub(c.start) <= MaxTransferTime
	c.first, c.hasFirst = c.last, follows
	if !follows {
		c.start = t
	}
	c.transfer, c.last, c.hasLast = transfer, keys[len(keys)-1], true
	c.keys, c.next = keys, 0
}

// Next returns the parent of the batch's chunks one after another, for a
// caller that takes them in order (RECEIVE): the first call is about
// keys[0]. Past the batch's end it knows no parent.
func (c *PushChain) Next() (chunk.Key, bool) {
	j := c.next
	if j >= len(c.keys) {
		return chunk.Key{}, false
	}
	c.next++
	return c.Parent(c.keys, j)
}

// Parent returns the parent of keys[j] in the batch Begin started with
// keys, and whether it is known.
func (c *PushChain) Parent(keys []chunk.Key, j int) (chunk.Key, bool) {
	if j > 0 {
		return keys[j-1], true
	}
	return c.first, c.hasFirst
}
