package engine

import (
	"context"
	"time"

	"kvtier/chunk"
	"kvtier/kvformat"
	"kvtier/tier"
)

// Layerwise retrieval (docs/layerwise.md): PrepareRetrieveLayers answers at
// once with slots for the whole hit and fills the lower-tier chunks layer
// by layer behind the reply; LayerWait tells the client when a layer of
// every chunk is in place and how many chunks turned out usable.

// AllLayers is LayerWait's count of ready layers for a lease with nothing
// left to read.
const AllLayers = 1<<32 - 1

// Layers is a chunk's layer geometry as a client states it: Parts × Layers
// equal spans, part-major (Parts 2 for KV_2LTD, 1 for KV_MLA_FMT). The
// zero value asks the engine to take it from the scope's format tag.
type Layers struct {
	Layers int
	Parts  int
	// Scope, for a request whose keys are all of one scope the client
	// registered (a handle's), is that scope's format tag: a stated
	// geometry is held against it even when the engine's registry has
	// forgotten the scope.
	Scope Scoped
}

// PrepareRetrieveLayers is PrepareRetrieve for a client that reads chunks
// layer by layer. With a geometry (given, or from a complete format tag in
// a layered layout), lower-tier hits are reserved in RAM and filled in the
// background, and the reply does not wait for them; otherwise it is
// PrepareRetrieve. Either way LayerWait on the lease says when a layer is
// ready.
func (e *Engine) PrepareRetrieveLayers(ctx context.Context, keys []chunk.Key, given Layers, ttl time.Duration, slots []Slot) ([]Slot, LeaseID, error) {
	ttl = e.leases.ttl(ttl)
	i, l := e.leases.build(leaseRetrieve)
	l.ids = growIDs(l.ids, len(keys))
	stated := tier.LayerGeometry{Layers: given.Layers, Parts: given.Parts}
	geo := func() tier.LayerGeometry {
		if given.Layers > 0 {
			return stated
		}
		g, _ := e.geometry(keys)
		return g
	}
	var n int
	var s *tier.Stream
	var err error
	exact := given.Layers > 0
	if exact { // a claim about the chunks: checked before any read
		if err = e.checkStated(keys, stated, given.Scope); err == nil {
			n, s, err = e.mgr.AcquireStreamExact(ctx, keys, l.ids, stated, time.Now().Add(ttl))
		}
	} else {
		n, s, err = e.mgr.AcquireStream(ctx, keys, l.ids, geo, time.Now().Add(ttl))
	}
	if s == nil && err == nil && n < len(keys) {
		var got int
		got, err = e.pendingInto(l, keys[n:], n, geo, exact)
		n += got
		if err != nil { // the RAM chunks before the pending ones go back
			l.ids = l.ids[:n]
			e.leases.discard(i)
			return slots, 0, err
		}
	}
	l.ids, l.stream = l.ids[:n], s
	if err != nil && n == 0 {
		e.leases.discard(i)
		return slots, 0, err
	}
	a := e.arenaOf()
	for j, id := range l.ids {
		size := a.Size(id)
		if exact && s == nil && !stated.Fits(size) {
			// A RAM hit is checked here, where its sizes are read anyway
			// (AcquireStreamExact); a misfit is refused before anything
			// else is taken (pendingInto checks RAM chunks first).
			e.leases.discard(i)
			return slots[:len(slots)-j], 0, tier.GeometryError(stated, j, size)
		}
		slots = append(slots, Slot{Offset: uint64(a.Offset(id)), Len: uint32(size)})
	}
	if n == 0 {
		e.leases.discard(i)
		return slots, 0, nil
	}
	return slots, e.leases.activate(i, ttl), nil
}

// LayerWait blocks until layer is in place in every usable chunk of
// retrieve lease id, the lease's deadline passes or ctx ends, and returns
// how many of the lease's chunks are usable, from its first (the rest
// failed to load and must be recomputed), and how many layers are ready in
// all of them. A lease without a background fill has every layer ready
// and answers AllLayers, so a client can skip its later waits. An unknown
// lease is ErrUnknownLease.
func (e *Engine) LayerWait(ctx context.Context, id LeaseID, layer int) (usable, ready int, err error) {
	s, chunks, deadline, ok := e.leases.stream(id)
	if !ok {
		return 0, 0, ErrUnknownLease
	}
	if s == nil {
		if srcs, geo := e.leases.pendingOf(id); len(srcs) > 0 {
			ctx, cancel := context.WithDeadline(ctx, deadline)
			defer cancel()
			usable, ready = waitPending(ctx, chunks, srcs, geo, layer)
			return usable, ready, nil
		}
		return chunks, AllLayers, nil
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	u, ready, err := s.Wait(ctx, layer)
	return chunks - s.Chunks() + u, ready, err
}

// geometry returns the layer geometry of keys' scope, when its format tag
// is complete and its layout keeps each layer in a few ranges. It
// allocates nothing: the tag was parsed when the scope's chunker was made.
func (e *Engine) geometry(keys []chunk.Key) (tier.LayerGeometry, bool) {
	if len(keys) == 0 {
		return tier.LayerGeometry{}, false
	}
	t, _ := e.specs.tag(keys[0].Scope)
	return LayerGeometryOf(t.spec)
}

// LayerGeometryOf returns where the layers of a chunk in spec's format
// lie, and false for a spec that is not complete or whose layout
// interleaves layers with tokens (KV_T2D, KV_2TD).
func LayerGeometryOf(spec kvformat.Spec) (tier.LayerGeometry, bool) {
	if spec.Layers == 0 || !spec.DType.Valid() {
		return tier.LayerGeometry{}, false
	}
	g := tier.LayerGeometry{Layers: spec.Layers}
	switch spec.Layout {
	case kvformat.Layout2LTD:
		g.Parts = 2
	case kvformat.LayoutMLA:
		g.Parts = 1
	default:
		return tier.LayerGeometry{}, false
	}
	return g, g.Valid()
}

// stream returns retrieve lease id's background fill (nil when it has
// none), how many chunks it holds and its deadline.
func (t *leaseTable) stream(id LeaseID) (*tier.Stream, int, time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.lookup(id)
	if !ok || t.slots[i].kind != leaseRetrieve {
		return nil, 0, time.Time{}, false
	}
	l := t.slots[i]
	return l.stream, len(l.ids), t.epoch.Add(time.Duration(l.deadline)), true
}

// pendingInto adds to lease l the leading keys (from index at) whose
// chunks are pending, when the chunks have a layer geometry, and returns
// how many it added. With exact (a geometry the reader stated), a pending
// chunk that does not split into it makes it take none and return an
// error wrapping ErrGeometry.
func (e *Engine) pendingInto(l *lease, keys []chunk.Key, at int, geo func() tier.LayerGeometry, exact bool) (int, error) {
	e.pend.mu.Lock()
	some := len(e.pend.m) > 0
	e.pend.mu.Unlock()
	if !some {
		return 0, nil
	}
	g := geo()
	if !g.Valid() {
		return 0, nil
	}
	if exact { // the RAM chunks before them first: a refusal takes no push
		a := e.arenaOf()
		for j, id := range l.ids[:at] {
			if size := a.Size(id); !g.Fits(size) {
				return 0, tier.GeometryError(g, j, size)
			}
		}
	}
	n, srcs, err := e.takePending(keys, l.ids[at:at+len(keys)], l.pending[:0], at, g, exact)
	l.pending, l.pgeo = srcs, g
	return n, err
}

// pendingOf returns a copy of retrieve lease id's pending chunks and
// their geometry.
func (t *leaseTable) pendingOf(id LeaseID) ([]PendingChunk, tier.LayerGeometry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.lookup(id)
	if !ok || len(t.slots[i].pending) == 0 {
		return nil, tier.LayerGeometry{}
	}
	l := t.slots[i]
	return append([]PendingChunk(nil), l.pending...), l.pgeo
}
