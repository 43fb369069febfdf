package server

import (
	"context"
	"encoding/binary"
	"errors"
	"time"

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
	// refs takes a received chunk's hold; consumedData says whether
	// receiveOne read the data frame's body.
	refs         engine.Refs
	consumedData bool
	wake         chan struct{} // this session's wake-ups, capacity 1 (see signal)
}

// wakeChan returns the session's wake-up channel, made on first use.
func (s *session) wakeChan() chan struct{} {
	if s.pd.wake == nil {
		s.pd.wake = make(chan struct{}, 1)
	}
	return s.pd.wake
}

// handleReceive serves RECEIVE: chunks another daemon pushes. Each chunk
// takes its bytes from the receive budget (waiting for readers to free
// some when it is full), is read straight into RAM, checked against its
// checksum and only then made visible and held. A failure stops storing;
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
	deadline := time.Now().Add(ttl)
	stored := 0
	var failed *requestError
	for j, size := range m.Sizes {
		dh, err := s.dataHeader(h, j == len(m.Sizes)-1)
		if err != nil {
			return fatal(wire.StatusBadRequest, "%v", err)
		}
		if dh.Len != size {
			return fatal(wire.StatusBadRequest, "data frame %d of %d bytes, announced %d", j, dh.Len, size)
		}
		if failed == nil {
			failed = s.receiveOne(dh, m.Keys.Raw[j], m.Sums[j], ttl, deadline)
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

// receiveOne stores one pushed chunk whose data frame header dh was just
// read; s.pd.consumedData says whether its body was read, whatever the
// outcome.
func (s *session) receiveOne(dh wire.Header, key chunk.Key, sum uint64, ttl time.Duration, deadline time.Time) *requestError {
	p := s.svc.pd
	s.pd.consumedData = false
	size := int64(dh.Len)
	if err := p.budget.acquire(p.ctx, size, deadline, s.wakeChan()); err != nil {
		switch {
		case errors.Is(err, errBudget):
			return fail(wire.StatusNoSpace, "%v", err)
		case errors.Is(err, context.Canceled):
			return fail(wire.StatusShuttingDown, "the daemon is shutting down")
		}
		return fail(wire.StatusTooLarge, "%v", err)
	}
	eng := s.svc.eng
	if eng.InRAM(key) {
		// Stored here already: drop the bytes, hold the chunk we have.
		s.armFrame(dh.Len)
		s.pd.consumedData = true
		if err := s.rd.Discard(dh.Len); err != nil {
			p.budget.release(size)
			return fatal(wire.StatusBadRequest, "%v", frameErr(err))
		}
		s.pd.held = p.hold(key, size, ttl, &s.pd.refs, s.pd.held)
		return nil
	}
	w := &s.writes
	w.Begin(eng)
	dst, err := w.Reserve(key, int(size))
	if err != nil {
		p.budget.release(size)
		return statusOf(err)
	}
	s.armFrame(dh.Len)
	s.pd.consumedData = true
	if err := s.rd.ReadData(dh, dst); err != nil {
		w.Abort()
		p.budget.release(size)
		return fatal(wire.StatusBadRequest, "%v", frameErr(err))
	}
	if wire.Checksum(dst) != sum {
		w.Abort()
		p.budget.release(size)
		return fail(wire.StatusBadRequest, "checksum mismatch: the chunk's bytes were damaged on the way")
	}
	if err := w.Commit(); err != nil {
		p.budget.release(size)
		return statusOf(err)
	}
	s.pd.held = p.hold(key, size, ttl, &s.pd.refs, s.pd.held)
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
	n := s.waitFor(keys, want, time.Duration(m.TimeoutMS)*time.Millisecond)
	reply := wire.WaitReply{Chunks: uint32(n), Tokens: r.tokensAfter(n)}
	s.out = reply.Append(wire.Begin(s.out))
	return s.reply(h, 0)
}

// waitFor returns the length of the leading run of keys in RAM once it
// reaches want, or when timeout (capped) has passed. Pushed chunks wake it
// as they land; chunks stored otherwise are seen when it ends.
func (s *session) waitFor(keys []chunk.Key, want int, timeout time.Duration) int {
	n := 0
	count := func() int {
		for n < len(keys) && s.svc.eng.InRAM(keys[n]) {
			n++
		}
		return n
	}
	if timeout <= 0 || count() >= want {
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
	r, rerr := s.resolve(&m.Keys)
	if rerr != nil {
		return rerr
	}
	queued, rerr := s.svc.pd.push(m, r.keys[r.first:])
	if rerr != nil {
		return rerr
	}
	s.out = binary.LittleEndian.AppendUint32(wire.Begin(s.out), uint32(queued))
	return s.reply(h, 0)
}

func (s *session) handlePushStatus(h wire.Header, body []byte) *requestError {
	var m wire.PushStatus
	if err := m.Decode(body); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	st, ok := s.svc.pd.status(m.Transfer)
	if !ok {
		return fail(wire.StatusNotFound, "transfer %d is unknown here (never pushed, or ended more than %v ago)", m.Transfer, keepEnded)
	}
	s.out = st.Append(wire.Begin(s.out))
	return s.reply(h, 0)
}
