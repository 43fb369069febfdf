package engine

import (
	"context"
	"sync"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
)

// Pending chunks (docs/layerwise.md, prefill/decode pushes per layer): a
// chunk that another daemon pushes layer by layer is reserved in RAM,
// still invisible, while its ranges arrive. A layerwise reader that finds
// one takes the reservation as a stream source: its slot is the
// reservation itself, and LayerWait waits on the chunk's own progress, as
// it waits on a lower tier's reads for a tier.Stream.

// PendingChunk is the progress of a chunk being written by ranges.
type PendingChunk interface {
	// WaitLayer returns nil once layer (under geo) is in place and
	// verified, and an error once the chunk failed and never will be.
	WaitLayer(ctx context.Context, geo tier.LayerGeometry, layer int) error
	// Taken notes that a reader took the chunk before it was complete.
	Taken()
}

type pendingEntry struct {
	id  arena.ID
	src PendingChunk
}

// pendingTable maps the keys of pending chunks to their reservations.
type pendingTable struct {
	mu sync.Mutex
	m  map[chunk.Key]pendingEntry
}

// Publish offers the chunk w reserved last, under key, to layerwise
// readers, with src telling them how far it got. Unpublish it before the
// reservation is committed or given back: a commit may free it (the key
// was stored meanwhile), and a reader must not find it then.
func (w *Writes) Publish(key chunk.Key, src PendingChunk) {
	if len(w.ids) == 0 {
		return
	}
	t := &w.e.pend
	t.mu.Lock()
	if t.m == nil {
		t.m = make(map[chunk.Key]pendingEntry)
	}
	t.m[key] = pendingEntry{id: w.ids[len(w.ids)-1], src: src}
	t.mu.Unlock()
}

// Unpublish withdraws key's pending chunk; readers that took it keep
// their reference and their answer from its PendingChunk.
func (e *Engine) Unpublish(key chunk.Key) {
	e.pend.mu.Lock()
	delete(e.pend.m, key)
	e.pend.mu.Unlock()
}

// IsPending reports whether key's chunk is being written by ranges.
func (e *Engine) IsPending(key chunk.Key) bool {
	e.pend.mu.Lock()
	defer e.pend.mu.Unlock()
	_, ok := e.pend.m[key]
	return ok
}

// takePending references the leading keys whose chunks are pending into
// ids, appends their sources to srcs and returns how many it took. A
// reservation it can no longer reference (freed: it was committed or
// given back before it was unpublished) ends the run there. With exact,
// a leading pending chunk that does not split into geo makes it take none
// (misfitPending).
func (e *Engine) takePending(keys []chunk.Key, ids []arena.ID, srcs []PendingChunk, at int, geo tier.LayerGeometry, exact bool) (int, []PendingChunk, error) {
	e.pend.mu.Lock()
	defer e.pend.mu.Unlock()
	a := e.arenaOf()
	if exact {
		if err := e.misfitPending(keys, at, geo); err != nil {
			return 0, srcs, err
		}
	}
	n := 0
	for n < len(keys) {
		p, ok := e.pend.m[keys[n]]
		if !ok {
			break
		}
		if !a.Ref(p.id) {
			break
		}
		p.src.Taken()
		ids[n], srcs = p.id, append(srcs, p.src)
		n++
	}
	return n, srcs, nil
}

// waitPending is LayerWait for a lease whose last chunks are pending:
// the chunks before them are in RAM. A pending chunk that fails, or the
// wait ending first, makes it and the chunks after it unusable.
func waitPending(ctx context.Context, chunks int, srcs []PendingChunk, geo tier.LayerGeometry, layer int) (usable, ready int) {
	base := chunks - len(srcs)
	for j, src := range srcs {
		if src.WaitLayer(ctx, geo, layer) != nil {
			return base + j, layer + 1
		}
	}
	return chunks, layer + 1
}
