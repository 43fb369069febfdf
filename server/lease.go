package server

import (
	"time"

	"kvtier/engine"
	"kvtier/wire"
)

// Leases are the engine's (engine.LeaseID: one table, one expiry rule,
// one reaper). A connection only remembers which of them it holds, so that
// it may release, renew or commit only its own, is bounded to MaxLeases,
// and ends them all when it closes.

// leaseAsked is the lease a request asks for, in the engine's terms: 0
// asks for the engine's default.
func leaseAsked(ms uint32) time.Duration { return time.Duration(ms) * time.Millisecond }

// hold records lease id (nothing for 0) as this connection's, or ends it
// and fails when the connection already holds MaxLeases.
func (s *session) hold(id engine.LeaseID) *requestError {
	if id == 0 {
		return nil
	}
	if s.leases == nil {
		s.leases = make(map[engine.LeaseID]struct{})
	}
	if len(s.leases) >= s.svc.opts.MaxLeases {
		s.forgetEnded()
	}
	if len(s.leases) >= s.svc.opts.MaxLeases {
		s.svc.eng.Release(id)
		return fail(wire.StatusNoSpace, "this connection holds %d leases, the limit", len(s.leases))
	}
	s.leases[id] = struct{}{}
	return nil
}

// owns reports whether this connection holds lease id.
func (s *session) owns(id engine.LeaseID) bool {
	_, ok := s.leases[id]
	return ok
}

// forgetEnded drops the leases that expired from the connection's set, so
// only live ones count against MaxLeases.
func (s *session) forgetEnded() {
	for id := range s.leases {
		if !s.svc.eng.LeaseActive(id) {
			delete(s.leases, id)
		}
	}
}

// releaseAll ends every lease of the connection, which is closing.
func (s *session) releaseAll() {
	for id := range s.leases {
		s.svc.eng.Release(id)
	}
	clear(s.leases)
}
