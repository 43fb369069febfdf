package server

import (
	"context"
	"encoding/binary"
	"errors"
	"time"

	"github.com/zeebo/xxh3"

	"kvtier/chunk"
	"kvtier/engine"
	"kvtier/wire"
)

// pdScratch is what a session reuses for the transfer operations.
type pdScratch struct {
	recv wire.Receive
	wait wire.Wait
	push wire.Push
	held []engine.Held
	// refs takes a received chunk's hold when the chunk is in RAM
	// already; consumedData says whether receiveOne read the data frame's
	// body.
	refs         engine.Refs
	consumedData bool
	pushRefs     engine.Refs   // a PUSH's chunks, before they join the transfer
	pushFed      []engine.Fed  // where they come from (pd_feed.go)
	wake         chan struct{} // this session's wake-ups, capacity 1 (see signal)
	hasher       *xxh3.Hasher  // checks received chunks as they arrive
	// recvID is the transfer of this connection's latest RECEIVE, and
	// recvStart when its first RECEIVE came (see budgetDeadline);
	// recvAdmitted says it has taken budget since (see budget).
	recvID       uint64
	recvStart    time.Time
	recvAdmitted bool
	budgetWait   waiter           // this session's place in the budget's queue
	chain        engine.PushChain // the received chunks' parents (engine/chain.go)
}

// wakeChan returns the session's wake-up channel, made on first use.
func (s *session) wakeChan() chan struct{} {
	if s.pd.wake == nil {
		s.pd.wake = make(chan struct{}, 1)
	}
	return s.pd.wake
}

// takeBudget takes n bytes of the receive budget for the connection's
// transfer, waiting for them until deadline, or says why it cannot. A
// transfer that took budget before on this connection may take free bytes
// past the waiters (see budget).
func (s *session) takeBudget(n int64, deadline time.Time) *requestError {
	p := s.svc.pd
	w := &s.pd.budgetWait
	w.wake = s.wakeChan()
	if err := p.budget.acquire(p.ctx, n, deadline, w, s.pd.recvAdmitted); err != nil {
		switch {
		case errors.Is(err, errBudget):
			return fail(wire.StatusNoSpace, "%v", err)
		case errors.Is(err, context.Canceled):
			return fail(wire.StatusShuttingDown, "the daemon is shutting down")
		}
		return fail(wire.StatusTooLarge, "%v", err)
	}
	s.pd.recvAdmitted = true
	return nil
}

// handleReceive serves RECEIVE: chunks another daemon pushes. Each chunk
// takes its bytes from the receive budget (waiting for readers to free
// some when it is full), is read straight into RAM and hashed as it
// arrives, checked against the checksum that follows it and only then
// made visible and held. A failure stops storing;
// the remaining data frames are read and dropped so the stream stays in
// step, and the reply says what went wrong.
func (s *session) handleReceive(h wire.Header) *requestError {
	body, err := s.rd.Body(h)
	if err != nil {
		return bodyError(err)
	}
	m := &s.pd.recv
	if err := m.Decode(body); err != nil {
		return fatal(wire.StatusBadRequest, "%v", err) // the data frames that follow cannot be skipped safely
	}
	if (h.Flags&wire.FlagMore != 0) != (len(m.Sizes) > 0) {
		return fatal(wire.StatusBadRequest, "RECEIVE of %d chunks with the more-frames flag %v", len(m.Sizes), h.Flags&wire.FlagMore != 0)
	}
	ttl := pdTimeout(m.HoldMS)
	deadline := s.pd.budgetDeadline(m.Transfer, ttl, time.Now())
	s.pd.chain.Begin(m.Transfer, m.Keys.Raw)
	stored := 0
	var failed *requestError
	for j, size := range m.Sizes {
		dh, err := s.dataHeader(h, j == len(m.Sizes)-1)
		if err != nil {
			return fatal(wire.StatusBadRequest, "%v", err)
		}
		if dh.Len != size+wire.ChecksumSize {
			return fatal(wire.StatusBadRequest, "data frame %d of %d bytes, announced %d and a checksum", j, dh.Len, size)
		}
		if failed == nil {
			failed = s.receiveOne(dh, m.Keys.Raw[j], ttl, deadline)
			if failed == nil {
				stored++
				continue
			}
			if failed.fatal {
				return failed
			}
			failed = fail(failed.status, "chunk %d of %d: %v", j, len(m.Sizes), failed.err)
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
	s.out = binary.LittleEndian.AppendUint32(wire.Begin(s.out), uint32(stored))
	return s.reply(h, 0)
}

// budgetDeadline is until when a RECEIVE of transfer id may wait for
// room in the budget: until the producer gives the transfer up. The
// producer sends its transfer timeout as the hold and keeps one
// connection for a transfer, whose first RECEIVE came after the transfer
// began; so that deadline is at most ttl after this connection's first
// RECEIVE of it, not ttl after each batch. A new transfer id on the
// connection (a pooled one, reused) starts anew, and so does the same id
// once that deadline has passed: the producer gave that transfer up by
// then, so this is a new one reusing its id, which must neither inherit
// a deadline already past nor pass the budget's queue as a transfer in
// progress. (The producer also never sends a transfer over a pooled
// connection that carried the same id last: see pd.conn.)
func (sc *pdScratch) budgetDeadline(id uint64, ttl time.Duration, now time.Time) time.Time {
	if id != sc.recvID || sc.recvStart.IsZero() || !now.Before(sc.recvStart.Add(ttl)) {
		sc.recvID, sc.recvStart, sc.recvAdmitted = id, now, false
	}
	return sc.recvStart.Add(ttl)
}

// receiveOne stores one pushed chunk whose data frame header dh was just
// read; s.pd.consumedData says whether its body was read, whatever the
// outcome.
func (s *session) receiveOne(dh wire.Header, key chunk.Key, ttl time.Duration, deadline time.Time) *requestError {
	p := s.svc.pd
	s.pd.consumedData = false
	up, hasUp := s.pd.chain.Next() // key's parent: asked in order, whatever follows
	size := int64(dh.Len) - wire.ChecksumSize
	if size == 0 {
		return fail(wire.StatusBadRequest, "an empty chunk: a chunk has at least one byte")
	}
	resident := s.holdResident(key, ttl)
	if !resident {
		if rerr := s.takeBudget(size, deadline); rerr != nil {
			return rerr
		}
		if resident = s.holdResident(key, ttl); resident { // stored while it waited
			p.budget.release(size)
		}
	}
	if resident {
		// Stored here already and held: drop the bytes. A failed read
		// leaves the hold, charged nothing, to its reader or its deadline.
		s.armFrame(dh.Len)
		s.pd.consumedData = true
		if err := s.rd.Discard(dh.Len); err != nil {
			return fatal(wire.StatusBadRequest, "%v", frameErr(err))
		}
		return nil
	}
	eng := s.svc.eng
	w := &s.writes
	w.Begin(eng)
	w.After(up, hasUp)
	dst, err := w.Reserve(key, int(size))
	if err != nil {
		p.budget.release(size)
		return statusOf(err)
	}
	s.armFrame(dh.Len)
	s.pd.consumedData = true
	if s.pd.hasher == nil {
		s.pd.hasher = xxh3.New()
	}
	got, want, err := s.rd.ReadSummed(dh, dst, s.pd.hasher)
	if err != nil {
		w.Abort()
		p.budget.release(size)
		return fatal(wire.StatusBadRequest, "%v", frameErr(err))
	}
	if got != want {
		w.Abort()
		p.budget.release(size)
		return fail(wire.StatusBadRequest, "checksum mismatch: the chunk's bytes were damaged on the way")
	}
	// The hold is taken before Commit lets the reservation's reference
	// go, so a store in between cannot evict the chunk first.
	p.expect(key) // visible from the commit on, held only after it
	held, n, err := w.CommitHeld(s.pd.held[:0])
	s.pd.held = held
	if err != nil || n == 0 {
		p.unexpect(key)
		p.budget.release(size)
		if err != nil {
			return statusOf(err)
		}
		return fail(wire.StatusNoSpace, "the chunk was dropped before it could be held")
	}
	p.keepExpected(key, held[0], size, ttl)
	p.arrived.broadcast()
	return nil
}

// handleWait serves WAIT: it replies once the leading run of the chunks
// the keys name (after the skip) that is in RAM is as long as asked, or
// when the wait runs out, with that run's length.
func (s *session) handleWait(h wire.Header, body []byte) *requestError {
	m := &s.pd.wait
	if err := m.Decode(body); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	r, rerr := s.resolve(&m.Keys)
	if rerr != nil {
		return rerr
	}
	keys := r.keys[r.first:]
	want := len(keys)
	if m.MinChunks > 0 {
		want = min(want, int(m.MinChunks))
	}
	n := s.waitFor(keys, want, time.Duration(m.TimeoutMS)*time.Millisecond, h.Flags&wire.FlagInProgress != 0)
	reply := wire.WaitReply{Chunks: uint32(n), Tokens: r.tokensAfter(n)}
	s.out = reply.Append(wire.Begin(s.out))
	return s.reply(h, 0)
}

// waitFor returns the length of the leading run of keys in RAM (with
// inProgress, followed by the run arriving by RECEIVE_LAYERS: what
// PREPARE_RETRIEVE_LAYERS takes, which stops at a chunk in RAM after a
// pending one) once it reaches want, or when timeout (capped) has passed.
// Pushed chunks wake it as they land; chunks stored otherwise are seen
// when it ends.
func (s *session) waitFor(keys []chunk.Key, want int, timeout time.Duration, inProgress bool) int {
	n := 0
	count := func() int {
		n = 0
		for n < len(keys) && s.svc.eng.InRAM(keys[n]) {
			n++
		}
		for inProgress && n < len(keys) && s.svc.eng.IsPending(keys[n]) {
			n++
		}
		return n
	}
	if count() >= want || timeout <= 0 { // a wait of 0 answers at once, with what is there
		return n
	}
	p, wake := s.svc.pd, s.wakeChan()
	p.arrived.add(wake) // then count again: an arrival in between is not missed
	defer p.arrived.remove(wake)
	timer := time.NewTimer(min(timeout, maxPDTimeout))
	defer timer.Stop()
	for count() < want {
		select {
		case <-wake:
		case <-timer.C:
			return count()
		case <-p.ctx.Done():
			return count()
		}
	}
	return n
}

// handlePush serves PUSH: the chunks are referenced here at once, so they
// cannot be evicted before they are sent, and queued on the transfer.
func (s *session) handlePush(h wire.Header, body []byte) *requestError {
	m := &s.pd.push
	if err := m.Decode(body); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	if m.StoreLease != 0 && !s.owns(engine.LeaseID(m.StoreLease)) {
		return fail(wire.StatusNotFound, "push: store lease %d is not this connection's", m.StoreLease)
	}
	r, rerr := s.resolve(&m.Keys)
	if rerr != nil {
		return rerr
	}
	queued, rerr := s.svc.pd.push(m, r.keys[r.first:], &s.pd.pushRefs, &s.pd.pushFed)
	if rerr != nil {
		return rerr
	}
	s.notePush(m.Transfer)
	s.out = binary.LittleEndian.AppendUint32(wire.Begin(s.out), uint32(queued))
	return s.reply(h, 0)
}

func (s *session) handlePushStatus(h wire.Header, body []byte) *requestError {
	var m wire.PushStatus
	if err := m.Decode(body); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	st, ok := s.svc.pd.status(m.Transfer)
	if !ok || !s.pushVisible(m.Transfer) {
		return fail(wire.StatusNotFound, "transfer %d is unknown here (never pushed, or ended more than %v ago)", m.Transfer, keepEnded)
	}
	s.out = st.Append(wire.Begin(s.out))
	return s.reply(h, 0)
}
