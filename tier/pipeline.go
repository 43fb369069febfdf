package tier

import "context"

// Span is bytes [From, To) of an object.
type Span struct{ From, To int }

// PipelinedRead is a RangeRead whose reads can be asked for before the
// bytes of earlier ones have arrived: each Send is one request to the
// store (every span of it in one round trip), and Recv waits for the
// oldest outstanding one. A store that pays a round trip per request (a
// peer daemon, tier/p2p) then never waits idle between a chunk's layers:
// Stream.fill keeps PipelineDepth requests in flight per chunk, within
// its window.
type PipelinedRead interface {
	RangeRead
	// Send asks for the spans' bytes, which land at their offsets in the
	// destination, without waiting for them. At most PipelineDepth Sends
	// may be outstanding, of at most MaxSpans spans each.
	Send(ctx context.Context, spans []Span) error
	// Recv waits until the bytes of the oldest outstanding Send are in
	// place and verified. A failure ends the reads: later Sends and Recvs
	// fail too.
	Recv(ctx context.Context) error
}

// PipelineDepth is how many Sends a PipelinedRead has in flight at most.
const PipelineDepth = 2

// MaxSpans bounds the spans of one Send: a layer's parts (2 in KV_2LTD).
const MaxSpans = 2
