package server

import (
	"context"
	"math"
	"slices"
	"time"

	"kvtier/engine"
	"kvtier/wire"
)

// FLUSH waits until every chunk stored before the request is in the tiers
// below RAM (the disk tier, whose Put returns once its record is
// fdatasync'ed, and any remote tier), writing again those whose queued
// write was dropped or refused, and reports per tier what is not. The
// admin API's POST /api/v1/flush does the same over HTTP.
func (s *session) handleFlush(h wire.Header, body []byte) *requestError {
	var m wire.Flush
	if err := m.Decode(body); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	wait := engine.FlushWait(time.Duration(m.TimeoutMS) * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	// Running out of time shows as pending writes. A tenant's reply
	// counts only its own scopes' redone and missing chunks.
	rep := s.svc.eng.SyncScopes(ctx, s.flushVisible())
	reply := wire.FlushReply{Tiers: make([]wire.FlushTier, 0, len(rep))}
	for _, t := range rep {
		reply.Tiers = append(reply.Tiers, wire.FlushTier{Name: t.Tier,
			Pending: clampU32(t.Pending), Redone: clampU32(t.Redone), Missing: clampU32(t.Missing)})
	}
	s.out = reply.Append(wire.Begin(s.out))
	return s.reply(h, 0)
}

// flushVisible selects the scopes a FLUSH reports on: every scope for a
// connection without a tenant (nil), a tenant's registered scopes and
// the scopes the connection opened for a tenant's.
func (s *session) flushVisible() func(uint64) bool {
	if s.tenant == nil {
		return nil
	}
	ids := s.svc.eng.ScopesWhere(s.tenant.AllowsScope)
	return func(id uint64) bool {
		_, found := slices.BinarySearch(ids, id)
		return found || s.opened(id)
	}
}

func clampU32(n int) uint32 { return uint32(min(max(n, 0), math.MaxUint32)) }
