package server

import (
	"context"
	"errors"
	"sync"

	"kvtier/tier"
	"kvtier/wire"
)

// A chunk arriving by RECEIVE_LAYERS is published to layerwise readers
// (engine.PendingChunk): PREPARE_RETRIEVE_LAYERS may take its reservation
// before it is complete, and LAYER_WAIT returns each layer once its ranges
// have arrived and matched their checksums.

var errPushFailed = errors.New("the push of this chunk failed before it was complete")

// inflight is the progress of one chunk being received by ranges.
type inflight struct {
	size int

	mu       sync.Mutex
	changed  chan struct{} // made by a waiter, closed at the next change: no waiter, no allocation
	arrived  []wire.ByteRange
	complete bool
	failed   bool
	taken    int // readers that took it before it was complete
}

// reset readies f (new, or one no reader ever took) for a chunk of size
// bytes, keeping its ranges' backing array.
func (f *inflight) reset(size int) {
	f.size, f.changed, f.arrived = size, nil, f.arrived[:0]
	f.complete, f.failed, f.taken = false, false, 0
}

// arrive records a verified range.
func (f *inflight) arrive(r wire.ByteRange) {
	f.mu.Lock()
	f.arrived = append(f.arrived, r)
	f.wakeLocked()
	f.mu.Unlock()
}

// end records the chunk complete (ok) or failed, and returns how many
// readers took it early.
func (f *inflight) end(ok bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.complete, f.failed = ok, !ok
	f.wakeLocked()
	return f.taken
}

func (f *inflight) wakeLocked() {
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
}

func (f *inflight) Taken() {
	f.mu.Lock()
	f.taken++
	f.mu.Unlock()
}

// WaitLayer implements engine.PendingChunk.
func (f *inflight) WaitLayer(ctx context.Context, geo tier.LayerGeometry, layer int) error {
	for {
		f.mu.Lock()
		done, failed := f.complete || f.hasLocked(geo, layer), f.failed
		if f.changed == nil {
			f.changed = make(chan struct{})
		}
		ch := f.changed
		f.mu.Unlock()
		switch {
		case failed:
			return errPushFailed
		case done:
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// hasLocked reports whether every byte of layer's spans has arrived.
// The ranges arrived never overlap (RECEIVE_LAYERS checks its table), so
// summing their overlaps with a span says whether it is covered.
func (f *inflight) hasLocked(geo tier.LayerGeometry, layer int) bool {
	for part := range geo.Parts {
		from, to, ok := geo.Range(f.size, layer, part)
		if !ok {
			return false // not split that way: only complete counts
		}
		covered := 0
		for _, r := range f.arrived {
			lo, hi := max(from, int(r.From)), min(to, int(r.To))
			if lo < hi {
				covered += hi - lo
			}
		}
		if covered < to-from {
			return false
		}
	}
	return true
}
