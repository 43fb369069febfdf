package server

import (
	"context"
	"errors"

	"kvtier/engine"
	"kvtier/wire"
)

// Layerwise retrieval on the local socket (docs/layerwise.md):
// PREPARE_RETRIEVE_LAYERS replies before lower-tier chunks are read, and
// LAYER_WAIT waits for one layer of all of them.

func (s *session) handlePrepareRetrieveLayers(h wire.Header, body []byte) *requestError {
	if rerr := s.requireArena(h.Op); rerr != nil {
		return rerr
	}
	m := &s.prepL
	if err := m.Decode(body); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	r, rerr := s.resolve(&m.Keys)
	if rerr != nil {
		return rerr
	}
	given := engine.Layers{Layers: int(m.Layers), Parts: int(m.Parts)}
	if m.Keys.Kind != wire.KindRaw { // a handle's keys: its registered scope's tag
		given.Scope = engine.Scoped{Format: s.scopes[m.Keys.Scope-1].scope.Format, Known: true}
	}
	slots, id, err := s.svc.eng.PrepareRetrieveLayers(context.Background(), r.keys[r.first:], given, leaseAsked(m.LeaseMS), s.eslots[:0])
	s.eslots = slots
	if errors.Is(err, engine.ErrGeometry) { // refused before any read
		return fail(wire.StatusBadRequest, "%v", err)
	}
	if err != nil {
		return statusOf(err)
	}
	s.svc.pd.consumed(r.keys[r.first : r.first+len(slots)])
	return s.replySlots(h, id, r.tokensAfter(len(slots)))
}

// handleLayerWait blocks the connection until the layer is ready, the
// lease's deadline passes or the daemon shuts down: the client has nothing
// else to do on it meanwhile (it waits for this very layer).
func (s *session) handleLayerWait(h wire.Header, body []byte) *requestError {
	var m wire.LayerWait
	if err := m.Decode(body); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	id := engine.LeaseID(m.Lease)
	if !s.owns(id) {
		return fail(wire.StatusNotFound, "lease %d is unknown, expired or released", m.Lease)
	}
	usable, ready, err := s.svc.eng.LayerWait(s.svc.pd.ctx, id, int(m.Layer))
	if err == engine.ErrUnknownLease {
		return fail(wire.StatusNotFound, "lease %d is not a retrieve lease, or ended", m.Lease)
	}
	// A wait cut short by the deadline or a shutdown still answers: the
	// layers not ready count as failed on the client's side.
	reply := wire.LayerReady{Usable: uint32(usable), Ready: uint32(ready)}
	s.out = reply.Append(wire.Begin(s.out))
	return s.reply(h, 0)
}
