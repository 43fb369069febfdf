package server

import (
	"encoding/binary"
	"time"

	"github.com/zeebo/xxh3"

	"kvtier/chunk"
	"kvtier/engine"
	"kvtier/wire"
)

// RECEIVE_LAYERS (docs/disaggregation.md, docs/protocol.md): a pushed
// chunk arrives as byte ranges, each checked against its own checksum as
// it lands in the chunk's reserved, still invisible RAM object. The
// request takes the budget of all its chunks at once, before its first
// range: its ranges come in layer order, so every chunk of it starts long
// before any completes, and a request that held part of the budget while
// waiting for more could wait for itself, or for another one doing the
// same, until its deadline. A batch larger than the whole budget is
// refused at once (NO_SPACE); a producer sizes its batches to the budget
// that the reply to a request of no chunks names. A chunk
// becomes visible and held, as with RECEIVE, once its last range is in; a
// range that fails its checksum, a stream that ends, or a producer that
// stops sending fails every chunk not yet complete: their reservations and
// budget are given back and nothing of them is ever served.

// recvChunk is one chunk of a RECEIVE_LAYERS request in progress.
type recvChunk struct {
	w       engine.Writes // the chunk's reservation, until it is complete
	dst     []byte        // the reserved bytes
	left    int64         // bytes still to arrive
	size    int64
	started bool      // budget taken and the chunk reserved (or found in RAM)
	open    bool      // reserved and not yet committed or given back
	inf     *inflight // its progress, published to layerwise readers while open
	spare   *inflight // an earlier chunk's, which no reader took: reused
}

// layerScratch is what a session reuses for RECEIVE_LAYERS.
type layerScratch struct {
	msg    wire.ReceiveLayers
	chunks []recvChunk
	pool   int64 // budget the request took and no chunk has yet
}

// maxLayerScratch and maxRangeScratch bound the tables a session keeps
// between requests (a batch of 64 chunks of 64 layers × 2 parts fits);
// larger ones are dropped after their request.
const (
	maxLayerScratch = 1024
	maxRangeScratch = 64 * 64 * 2
)

// handleReceiveLayers serves RECEIVE_LAYERS. Every exit gives back what
// is reserved and not complete; the chunks completed stay held.
func (s *session) handleReceiveLayers(h wire.Header) *requestError {
	body, err := s.rd.Body(h)
	if err != nil {
		return bodyError(err)
	}
	m := &s.pdl.msg
	if err := m.Decode(body); err != nil {
		return fatal(wire.StatusBadRequest, "%v", err) // the data frames that follow cannot be skipped safely
	}
	if (h.Flags&wire.FlagMore != 0) != (len(m.Ranges) > 0) {
		return fatal(wire.StatusBadRequest, "RECEIVE_LAYERS of %d ranges with the more-frames flag %v", len(m.Ranges), h.Flags&wire.FlagMore != 0)
	}
	s.pdl.reset(len(m.Sizes))
	defer s.endLayers()
	ttl := pdTimeout(m.HoldMS)
	if len(m.Sizes) == 0 { // a probe: the answer names the budget, to size batches by
		s.out = binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint32(wire.Begin(s.out), 0), uint64(s.svc.pd.budget.limit))
		return s.reply(h, 0)
	}
	deadline := s.pd.budgetDeadline(m.Transfer, ttl, time.Now())
	s.pd.chain.Begin(m.Transfer, m.Keys.Raw)
	failed := s.takeBatchBudget(m, deadline)
	for i, r := range m.Ranges {
		dh, err := s.dataHeader(h, i == len(m.Ranges)-1)
		if err != nil {
			return fatal(wire.StatusBadRequest, "%v", err)
		}
		if dh.Len != r.To-r.From+wire.ChecksumSize {
			return fatal(wire.StatusBadRequest, "data frame %d of %d bytes, announced %d and a checksum", i, dh.Len, r.To-r.From)
		}
		if failed == nil {
			failed = s.receiveRange(dh, r, ttl)
			if failed != nil && failed.fatal {
				return failed
			}
			if failed == nil {
				continue
			}
			failed = fail(failed.status, "range %d (chunk %d, bytes [%d, %d)): %v", i, r.Key, r.From, r.To, failed.err)
			s.abortOpen() // a failed chunk fails the rest: the reply counts leading chunks
			if s.pd.consumedData {
				continue
			}
		}
		s.armFrame(dh.Len)
		if err := s.rd.Discard(dh.Len); err != nil {
			return fatal(wire.StatusBadRequest, "%v", frameErr(err))
		}
	}
	if failed != nil {
		return failed
	}
	stored := 0
	for stored < len(s.pdl.chunks) && s.pdl.chunks[stored].started && s.pdl.chunks[stored].left == 0 {
		stored++
	}
	s.out = binary.LittleEndian.AppendUint32(wire.Begin(s.out), uint32(stored))
	return s.reply(h, 0)
}

// takeBatchBudget takes the budget of every chunk of the request at once,
// waiting until deadline, into s.pdl.pool.
func (s *session) takeBatchBudget(m *wire.ReceiveLayers, deadline time.Time) *requestError {
	p := s.svc.pd
	var total int64
	for _, n := range m.Sizes {
		total += int64(n)
	}
	if total > p.budget.limit {
		if len(m.Sizes) == 1 {
			return fail(wire.StatusTooLarge, "a chunk of %d bytes is larger than pd_receive_bytes (%d)", total, p.budget.limit)
		}
		return fail(wire.StatusNoSpace, "%s: a batch of %d chunks, %d bytes, is larger than pd_receive_bytes (%d); send fewer at once", errBudget, len(m.Sizes), total, p.budget.limit)
	}
	if rerr := s.takeBudget(total, deadline); rerr != nil {
		return rerr
	}
	s.pdl.pool = total
	return nil
}

// endLayers ends a request: it gives back what is reserved and not
// complete, and the budget no chunk took, and drops an oversized table.
func (s *session) endLayers() {
	s.abortOpen()
	if s.pdl.pool > 0 {
		s.svc.pd.budget.release(s.pdl.pool)
		s.pdl.pool = 0
	}
	if cap(s.pdl.chunks) > maxLayerScratch {
		s.pdl.chunks = nil
	}
	if cap(s.pdl.msg.Ranges) > maxRangeScratch || cap(s.pdl.msg.Sizes) > maxLayerScratch || cap(s.pdl.msg.Keys.Raw) > maxLayerScratch {
		s.pdl.msg = wire.ReceiveLayers{}
	}
}

// reset readies the scratch for a request of n chunks.
func (sc *layerScratch) reset(n int) {
	if cap(sc.chunks) < n {
		sc.chunks = append(sc.chunks[:cap(sc.chunks)], make([]recvChunk, n-cap(sc.chunks))...)
	}
	sc.chunks = sc.chunks[:n]
	for j := range sc.chunks {
		c := &sc.chunks[j]
		c.dst, c.left, c.size, c.started, c.open, c.inf = nil, 0, 0, false, false, nil
	}
}

// receiveRange reads one range's data frame into its chunk, starting the
// chunk on its first range and making it visible on its last;
// s.pd.consumedData says whether it read the frame's body.
func (s *session) receiveRange(dh wire.Header, r wire.ByteRange, ttl time.Duration) *requestError {
	m := &s.pdl.msg
	c := &s.pdl.chunks[r.Key]
	s.pd.consumedData = false
	if !c.started {
		if rerr := s.startChunk(c, m, int(r.Key), ttl); rerr != nil {
			return rerr
		}
	}
	s.armFrame(dh.Len)
	s.pd.consumedData = true
	if !c.open { // held already (it was in RAM): drop the bytes
		if err := s.rd.Discard(dh.Len); err != nil {
			return fatal(wire.StatusBadRequest, "%v", frameErr(err))
		}
		return nil
	}
	if s.pd.hasher == nil {
		s.pd.hasher = xxh3.New()
	}
	got, want, err := s.rd.ReadSummed(dh, c.dst[r.From:r.To], s.pd.hasher)
	if err != nil {
		return fatal(wire.StatusBadRequest, "%v", frameErr(err))
	}
	if got != want {
		return fail(wire.StatusBadRequest, "checksum mismatch: the range's bytes were damaged on the way")
	}
	c.inf.arrive(r)
	c.left -= int64(r.To - r.From)
	if c.left > 0 {
		return nil
	}
	return s.completeChunk(c, m.Keys.Raw[r.Key], ttl)
}

// startChunk moves chunk j's budget from the request's to the chunk and
// reserves it, or holds the copy already in RAM.
func (s *session) startChunk(c *recvChunk, m *wire.ReceiveLayers, j int, ttl time.Duration) *requestError {
	p := s.svc.pd
	c.size = int64(m.Sizes[j])
	s.pdl.pool -= c.size
	c.started, c.left = true, c.size
	key, eng := m.Keys.Raw[j], s.svc.eng
	if s.holdResident(key, ttl) { // its budget goes back: see holdResident
		p.budget.release(c.size)
		c.left = 0
		return nil
	}
	c.w.Begin(eng)
	c.w.After(s.pd.chain.Parent(m.Keys.Raw, j))
	dst, err := c.w.Reserve(key, int(c.size))
	if err != nil {
		p.budget.release(c.size)
		c.left = 0
		c.started = false
		return statusOf(err)
	}
	c.dst, c.open = dst, true
	c.inf, c.spare = c.spare, nil
	if c.inf == nil {
		c.inf = new(inflight)
	}
	c.inf.reset(int(c.size))
	c.w.Publish(key, c.inf)
	p.arrived.broadcast() // a WAIT for chunks in progress counts it now
	return nil
}

// completeChunk makes a chunk whose every range arrived visible and holds
// it, the hold taken before the reservation's reference goes (as
// receiveOne does).
func (s *session) completeChunk(c *recvChunk, key chunk.Key, ttl time.Duration) *requestError {
	p := s.svc.pd
	c.open = false
	// Withdrawn first: the commit frees the reservation when the key was
	// stored meanwhile, and no reader may take it then. No reader takes
	// it after this either, so c.inf's count of those that did is final.
	s.svc.eng.Unpublish(key)
	p.expect(key) // visible from the commit on, held only after it
	held, n, err := c.w.CommitHeld(s.pd.held[:0])
	s.pd.held = held
	if err != nil || n == 0 {
		p.unexpect(key)
		c.recycle(c.inf.end(false))
		p.budget.release(c.size)
		c.started = false // not stored: the reply's count stops before it
		if err != nil {
			return statusOf(err)
		}
		return fail(wire.StatusNoSpace, "the chunk was dropped before it could be held")
	}
	p.keepExpected(key, held[0], c.size, ttl)
	// Readers that took it in progress hold their own reference: their
	// reads end its hold, as a read of the held chunk would.
	taken := c.inf.end(true)
	c.recycle(taken)
	p.consumedInProgress(key, taken)
	p.arrived.broadcast()
	return nil
}

// abortOpen gives back every chunk of the request that is reserved and
// not complete, with its budget.
func (s *session) abortOpen() {
	for j := range s.pdl.chunks {
		c := &s.pdl.chunks[j]
		if !c.open {
			continue
		}
		s.svc.eng.Unpublish(s.pdl.msg.Keys.Raw[j])
		c.recycle(c.inf.end(false))
		c.w.Abort()
		s.svc.pd.budget.release(c.size)
		c.open, c.started, c.dst = false, false, nil
	}
}

// recycle keeps the chunk's progress for the next chunk in this slot when
// no reader took it (taken): unpublished, nobody else can see it.
func (c *recvChunk) recycle(taken int) {
	if taken == 0 {
		c.spare = c.inf
	}
	c.inf = nil
}
