package p2p

import (
	"context"
	"errors"
	"fmt"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/tier"
	"kvtier/tier/remote"
	"kvtier/wire"
)

// Range reads (layerwise loads, docs/layerwise.md). OpenRange takes one of
// the peer's connections for the chunk alone and a lease on the chunk
// there (LOOKUP with a lease), so that the chunk stays in the peer's RAM
// or on its disk between ranges and no range pays a LOOKUP; each
// ReadRange is one RETRIEVE_RANGES on that connection, checked range by
// range; Close releases the lease and gives the connection back. The
// circuit breaker is asked at OpenRange and told each range's outcome.

var (
	_ tier.RangeReader   = (*Tier)(nil)
	_ tier.RangeChooser  = (*Tier)(nil)
	_ tier.PipelinedRead = (*peerRange)(nil)
)

// ReadsRanges implements tier.RangeChooser: a peer answers ranges from
// its RAM by reference and from its disk a range at a time (without
// promoting the chunk first), so reading a layer costs a round trip and
// only that layer's bytes.
func (t *Tier) ReadsRanges() bool { return true }

// OpenRange implements tier.RangeReader on the peer Size found key on.
func (t *Tier) OpenRange(ctx context.Context, key chunk.Key, dst []byte) (tier.RangeRead, error) {
	loc, ok := t.recall(key)
	if !ok {
		if _, ok = t.Size(key); ok {
			loc, ok = t.recall(key)
		}
	}
	if !ok {
		t.misses.Add(1)
		return nil, fmt.Errorf("p2p tier: %v: %w", key, tier.ErrNotFound)
	}
	t.forget(key)
	if loc.size != len(dst) {
		t.misses.Add(1)
		return nil, fmt.Errorf("p2p tier: %v: %d bytes on the peer, %d asked: %w", key, loc.size, len(dst), tier.ErrNotFound)
	}
	g := t.peers.get(loc.addr)
	s, _ := g.Inner().(*store)
	if s == nil {
		t.misses.Add(1)
		return nil, fmt.Errorf("p2p peer %s: not a peer store: %w", loc.addr, tier.ErrNotFound)
	}
	if s.ranged.Add(1) > int32(s.o.RangedConns) {
		// Read whole instead; that read goes through the breaker itself.
		s.ranged.Add(-1)
		return &wholePeerRead{t: t, g: g, s: s, key: key, dst: dst}, nil
	}
	admitted, trial := g.Admits()
	if !admitted {
		s.ranged.Add(-1)
		t.misses.Add(1)
		return nil, fmt.Errorf("p2p peer %s: circuit open: %w", loc.addr, tier.ErrNotFound)
	}
	r := &peerRange{t: t, g: g, s: s, key: key, trial: trial}
	r.keys = [1]chunk.Key{key}
	r.dst[0] = dst
	if err := r.open(ctx); err != nil { // open gave the ranged slot back
		t.misses.Add(1)
		return nil, err
	}
	return r, nil
}

// wholePeerRead reads a chunk whole at its first range, for a stream past
// the peer's RangedConns: such reads take a pooled connection only for
// the one RETRIEVE (whole-chunk checksum), at most Conns at once, and
// never hold one while the stream waits for other chunks.
type wholePeerRead struct {
	t    *Tier
	g    *remote.Guarded
	s    *store
	key  chunk.Key
	dst  []byte
	done bool
}

// ReadRange implements tier.RangeRead: the first call reads every byte.
func (w *wholePeerRead) ReadRange(ctx context.Context, from, to int) error {
	if w.done {
		return nil
	}
	select {
	case w.s.whole <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	n, err := w.g.Get(ctx, w.key, w.dst)
	<-w.s.whole
	if err == nil && n != len(w.dst) {
		err = fmt.Errorf("p2p peer %s: %v: %d bytes, %d expected: %w", w.s.addr, w.key, n, len(w.dst), tier.ErrNotFound)
	}
	if err != nil {
		w.t.misses.Add(1)
		if errors.Is(err, tier.ErrCorrupt) {
			w.t.corrupt.Add(1)
		}
		return err
	}
	w.done = true
	w.t.hits.Add(1)
	w.t.bytesRead.Add(uint64(n))
	return nil
}

// Close implements tier.RangeRead; a whole read holds nothing.
func (w *wholePeerRead) Close() {}

// peerRange is one chunk streamed from a peer on a connection of its own.
type peerRange struct {
	t     *Tier
	g     *remote.Guarded
	s     *store
	c     *client.Client
	key   chunk.Key
	keys  [1]chunk.Key
	dst   [1][]byte
	rng   [1]wire.ByteRange
	lease uint64
	bad   bool // the connection failed or is out of step: closed, not pooled
	trial bool // holds the breaker's half-open trial until the first Report
	read  int  // bytes read, counted at Close
	// Requests sent and not yet received (Send, Recv), oldest at head.
	sent        [tier.PipelineDepth]sentRanges
	head, count int
}

// sentRanges is one request in flight.
type sentRanges struct {
	id    uint32
	rng   [tier.MaxSpans]wire.ByteRange
	n     int
	bytes int
}

// open takes a connection and a lease on the chunk. On failure it has
// given back the ranged slot OpenRange took.
func (r *peerRange) open(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.s.o.Timeout)
	defer cancel()
	c, err := r.s.take(ctx)
	if err != nil {
		r.report(ctx, err)
		r.s.ranged.Add(-1) // done, which gives it back otherwise, needs a connection
		return err
	}
	r.c = c
	hit, err := c.Lookup(ctx, client.Raw(r.keys[:]), uint32(r.s.o.Lease.Milliseconds()))
	r.report(ctx, err)
	if err == nil && hit.Chunks == 0 {
		err = fmt.Errorf("p2p peer %s: %v: %w", r.s.addr, r.key, tier.ErrNotFound)
	}
	if err != nil {
		r.bad = errors.Is(err, client.ErrClosed)
		r.done()
		return err
	}
	r.lease = hit.Lease
	return nil
}

// report tells the breaker a call's outcome, giving back its half-open
// trial with the first.
func (r *peerRange) report(ctx context.Context, err error) {
	r.g.Report(ctx, err, r.trial)
	r.trial = false
}

// ReadRange implements tier.RangeRead: bytes [from, to) of the chunk,
// checked against the checksum the peer sends for them.
func (r *peerRange) ReadRange(ctx context.Context, from, to int) error {
	if r.c == nil {
		return fmt.Errorf("p2p peer %s: %v: %w", r.s.addr, r.key, tier.ErrClosed)
	}
	ctx, cancel := remote.BoundCall(ctx, r.s.o.Timeout, r.s.o.Bandwidth, to-from)
	defer cancel()
	r.rng[0] = wire.ByteRange{Key: 0, From: uint32(from), To: uint32(to)}
	sizes, n, err := r.c.RetrieveRanges(ctx, client.Raw(r.keys[:]), r.rng[:], r.dst[:])
	if err == nil && n > 0 && sizes[0] != uint32(len(r.dst[0])) {
		// The checksums prove the bytes are the peer's, not that the
		// peer's chunk is the size this one's layers were laid out for.
		n, err = 0, nil
	}
	switch {
	case errors.Is(err, client.ErrChecksum):
		err = fmt.Errorf("p2p peer %s: %w: %w", r.s.addr, tier.ErrCorrupt, err)
		r.t.corrupt.Add(1)
	case err != nil:
		err = fmt.Errorf("p2p peer %s: %w", r.s.addr, err)
	case n == 0:
		// Gone from the peer despite the lease (cleared, or the peer
		// restarted): the chunk is a miss from here on.
		err = fmt.Errorf("p2p peer %s: %v: %w", r.s.addr, r.key, tier.ErrNotFound)
	}
	r.report(ctx, err)
	if err != nil {
		if errors.Is(err, client.ErrClosed) || errors.Is(err, client.ErrChecksum) {
			r.bad = true
		}
		r.t.misses.Add(1)
		r.done()
		return err
	}
	r.g.ReportVerified() // the bytes matched the peer's checksum
	r.read += to - from
	return nil
}

// Close implements tier.RangeRead: the lease is released and the
// connection given back.
func (r *peerRange) Close() {
	if r.c == nil {
		return
	}
	r.t.hits.Add(1)
	r.t.bytesRead.Add(uint64(r.read))
	r.done()
}

// done releases the lease (a release that fails leaves it to lapse) and
// returns the connection to the pool, or closes it when it is broken or
// replies are still due on it (the peer releases the lease of a closed
// connection itself).
func (r *peerRange) done() {
	if r.c == nil {
		return
	}
	if r.count > 0 {
		r.bad = true
		r.count = 0
	}
	if r.lease != 0 && !r.bad {
		ctx, cancel := r.s.ctx()
		if err := r.c.Release(ctx, r.lease); errors.Is(err, client.ErrClosed) {
			r.bad = true
		}
		cancel()
	}
	r.s.give(r.c, r.bad)
	r.c, r.lease = nil, 0
	r.s.ranged.Add(-1)
}

// Send implements tier.PipelinedRead: one RETRIEVE_RANGES of the spans,
// written without waiting for the replies to earlier ones.
func (r *peerRange) Send(ctx context.Context, spans []tier.Span) error {
	if r.c == nil {
		return fmt.Errorf("p2p peer %s: %v: %w", r.s.addr, r.key, tier.ErrClosed)
	}
	if r.count == len(r.sent) || len(spans) > tier.MaxSpans {
		return fmt.Errorf("p2p peer %s: %d requests in flight, %d spans", r.s.addr, r.count, len(spans))
	}
	q := &r.sent[(r.head+r.count)%len(r.sent)]
	q.n, q.bytes = len(spans), 0
	for i, sp := range spans {
		q.rng[i] = wire.ByteRange{Key: 0, From: uint32(sp.From), To: uint32(sp.To)}
		q.bytes += sp.To - sp.From
	}
	ctx, cancel := context.WithTimeout(ctx, r.s.o.Timeout)
	defer cancel()
	id, err := r.c.SendRetrieveRanges(ctx, client.Raw(r.keys[:]), q.rng[:q.n])
	if err != nil {
		return r.failed(ctx, fmt.Errorf("p2p peer %s: %w", r.s.addr, err))
	}
	q.id = id
	r.count++
	return nil
}

// Recv implements tier.PipelinedRead: the reply to the oldest Send, each
// range checked against the checksum the peer sends for it.
func (r *peerRange) Recv(ctx context.Context) error {
	if r.c == nil || r.count == 0 {
		return fmt.Errorf("p2p peer %s: %v: no request in flight: %w", r.s.addr, r.key, tier.ErrClosed)
	}
	q := &r.sent[r.head]
	r.head, r.count = (r.head+1)%len(r.sent), r.count-1
	ctx, cancel := remote.BoundCall(ctx, r.s.o.Timeout, r.s.o.Bandwidth, q.bytes)
	defer cancel()
	sizes, n, err := r.c.RecvRetrieveRanges(ctx, q.id, q.rng[:q.n], r.dst[:])
	if err == nil && n > 0 && sizes[0] != uint32(len(r.dst[0])) {
		n = 0 // not the size this chunk's layers were laid out for
	}
	switch {
	case errors.Is(err, client.ErrChecksum):
		r.t.corrupt.Add(1)
		err = fmt.Errorf("p2p peer %s: %w: %w", r.s.addr, tier.ErrCorrupt, err)
	case err != nil:
		err = fmt.Errorf("p2p peer %s: %w", r.s.addr, err)
	case n < q.n:
		err = fmt.Errorf("p2p peer %s: %v: %w", r.s.addr, r.key, tier.ErrNotFound)
	}
	if err != nil {
		return r.failed(ctx, err)
	}
	r.report(ctx, nil)
	r.g.ReportVerified()
	r.read += q.bytes
	return nil
}

// failed reports a failed Send or Recv to the breaker, counts the miss
// and ends the reads.
func (r *peerRange) failed(ctx context.Context, err error) error {
	r.report(ctx, err)
	if errors.Is(err, client.ErrClosed) || errors.Is(err, client.ErrChecksum) {
		r.bad = true
	}
	r.t.misses.Add(1)
	r.done()
	return err
}
