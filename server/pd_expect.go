package server

import (
	"time"

	"kvtier/chunk"
	"kvtier/engine"
)

// A received chunk becomes visible when its reservation is committed,
// and its hold is registered just after, once the commit has handed over
// the reference. A reader that finds the chunk in between (its WAIT
// returns as soon as the chunk is in RAM) would read it before the hold
// exists: its read would end nothing, and the hold would keep the chunk's
// bytes charged to the receive budget until its deadline — long enough to
// stall a push larger than the budget, whose next batch waits for exactly
// those bytes. So the receiver announces the hold before the commit
// (expect), a read of an announced chunk is remembered, and the hold it
// was for ends as soon as it is registered (keepExpected).

// expect announces that key's chunk is about to become visible and be
// held; keepExpected or unexpect must follow.
func (p *pd) expect(key chunk.Key) {
	p.mu.Lock()
	if p.expecting == nil {
		p.expecting, p.readEarly = make(map[chunk.Key]int), make(map[chunk.Key]int)
	}
	p.expecting[key]++
	p.nexpect.Add(1)
	p.mu.Unlock()
}

// unexpect withdraws expect: the chunk was not held after all.
func (p *pd) unexpect(key chunk.Key) {
	p.mu.Lock()
	p.endExpectLocked(key)
	p.mu.Unlock()
}

// keepExpected is keep for a chunk announced by expect: a read that came
// in between ends the hold at once.
func (p *pd) keepExpected(key chunk.Key, h engine.Held, size int64, ttl time.Duration) {
	p.mu.Lock() // one section: a read between the two would find neither
	giveBack := p.takeEarlyReadLocked(key) || p.keepLocked(key, h, size, ttl)
	p.endExpectLocked(key) // after the hold is in: see consumed's first check
	p.mu.Unlock()
	if giveBack {
		p.eng.Unhold(h)
		p.budget.release(size)
	}
}

// readEarlyLocked notes a read of key, which no hold covers, if its hold
// is announced.
func (p *pd) readEarlyLocked(key chunk.Key) {
	if p.expecting[key] > 0 {
		p.readEarly[key]++
	}
}

// takeEarlyReadLocked takes one read noted for key's announced hold, if any.
func (p *pd) takeEarlyReadLocked(key chunk.Key) bool {
	if p.readEarly[key] == 0 {
		return false
	}
	p.readEarly[key]--
	return true
}

// endExpectLocked ends one announcement of key; the reads noted for it
// go with the last.
func (p *pd) endExpectLocked(key chunk.Key) {
	if p.expecting[key]--; p.expecting[key] <= 0 {
		delete(p.expecting, key)
		delete(p.readEarly, key)
	}
	p.nexpect.Add(-1)
}

// holdResident holds key's chunk for its reader if it is in RAM already
// (a push of a chunk the consumer has), and reports whether it did. The
// hold is announced before the chunk is looked up and registered before
// the pushed bytes are dropped, so a read from the lookup on ends it. A
// read before the push came cannot be told from a read of an earlier
// copy, so such a hold may wait for its deadline; it charges nothing to
// the receive budget, whose bytes bound what pushes add to RAM: this
// chunk was there before the push.
func (s *session) holdResident(key chunk.Key, ttl time.Duration) bool {
	p := s.svc.pd
	p.expect(key)
	if !s.pd.refs.AcquireRAMKey(s.svc.eng, key) {
		p.unexpect(key)
		return false
	}
	s.pd.held = s.pd.refs.Detach(s.pd.held[:0])
	p.keepExpected(key, s.pd.held[0], 0, ttl)
	return true
}

// consumedInProgress ends key's hold once for each of the taken readers
// that took the chunk while it was arriving (their reads end its hold, as
// a read of the held chunk would). Unlike consumed it notes no early read
// when the hold is gone: these readers were counted at their prepare
// already, and an early read noted now would be taken by another push of
// the same key in its commit window, ending that push's hold unread.
func (p *pd) consumedInProgress(key chunk.Key, taken int) {
	if taken == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for range taken {
		h, ok := p.holds[key]
		switch {
		case !ok:
			return
		case h.readers > 1:
			h.readers--
			p.holds[key] = h
		default:
			p.dropLocked(key, h)
		}
	}
}
