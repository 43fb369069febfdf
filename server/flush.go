package server

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"time"

	"kvtier/engine"
	"kvtier/wire"
)

// FLUSH and POST /api/v1/flush: wait until every chunk stored before the
// request is in the tiers below RAM (the disk tier, whose Put returns once
// its record is fdatasync'ed, and any remote tier), writing again those
// whose queued write was dropped or refused; report per tier what is not.

// How long a flush may wait: a default for requests that name no bound,
// and a cap on those that do.
const (
	defaultFlushWait = time.Minute
	maxFlushWait     = 10 * time.Minute
)

// flushWait turns a requested bound (0: none) into the wait to use.
func flushWait(asked time.Duration) time.Duration {
	if asked <= 0 {
		return defaultFlushWait
	}
	return min(asked, maxFlushWait)
}

func (s *session) handleFlush(h wire.Header, body []byte) *requestError {
	var m wire.Flush
	if err := m.Decode(body); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), flushWait(time.Duration(m.TimeoutMS)*time.Millisecond))
	defer cancel()
	rep := s.svc.eng.Sync(ctx) // running out of time shows as pending writes
	reply := wire.FlushReply{Tiers: make([]wire.FlushTier, 0, len(rep))}
	for _, t := range rep {
		reply.Tiers = append(reply.Tiers, wire.FlushTier{Name: t.Tier,
			Pending: clampU32(t.Pending), Redone: clampU32(t.Redone), Missing: clampU32(t.Missing)})
	}
	s.out = reply.Append(wire.Begin(s.out))
	return s.reply(h, 0)
}

func clampU32(n int) uint32 { return uint32(min(max(n, 0), math.MaxUint32)) }

// FlushResult is the body of POST /api/v1/flush.
type FlushResult struct {
	// Durable is true when every chunk stored before the flush is in
	// every tier below RAM.
	Durable bool        `json:"durable"`
	Tiers   []FlushTier `json:"tiers"`
}

// FlushTier is engine.TierSync with JSON names.
type FlushTier struct {
	Tier    string `json:"tier"`
	Pending int    `json:"pending"`
	Redone  int    `json:"redone"`
	Missing int    `json:"missing"`
}

func flushResult(rep []engine.TierSync) FlushResult {
	r := FlushResult{Durable: true, Tiers: make([]FlushTier, 0, len(rep))}
	for _, t := range rep {
		r.Tiers = append(r.Tiers, FlushTier{Tier: t.Tier, Pending: t.Pending, Redone: t.Redone, Missing: t.Missing})
		if t.Pending != 0 || t.Missing != 0 {
			r.Durable = false
		}
	}
	return r
}

// flush serves POST /api/v1/flush?timeout=30s: 200 when everything stored
// before it is durable, 503 with the same report when not.
func (a *Admin) flush(w http.ResponseWriter, r *http.Request) {
	var asked time.Duration
	if v := r.URL.Query().Get("timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			writeError(w, http.StatusBadRequest, fmt.Errorf("timeout %q: want a positive duration such as 30s", v))
			return
		}
		asked = d
	}
	ctx, cancel := context.WithTimeout(r.Context(), flushWait(asked))
	defer cancel()
	rep := a.eng.Sync(ctx)
	res := flushResult(rep)
	status := http.StatusOK
	if !res.Durable {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, res)
}
