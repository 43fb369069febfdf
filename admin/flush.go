package admin

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"kvtier/engine"
)

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

// flush serves POST /api/v1/flush?timeout=30s: wait until every chunk
// stored before the request is in the tiers below RAM (engine.Sync), then
// answer 200 when everything is durable, 503 with the same report when not.
func (a *API) flush(w http.ResponseWriter, r *http.Request) {
	var asked time.Duration
	if v := r.URL.Query().Get("timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			writeError(w, http.StatusBadRequest, fmt.Errorf("timeout %q: want a positive duration such as 30s", v))
			return
		}
		asked = d
	}
	ctx, cancel := context.WithTimeout(r.Context(), engine.FlushWait(asked))
	defer cancel()
	res := flushResult(a.eng.Sync(ctx))
	status := http.StatusOK
	if !res.Durable {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, res)
}
