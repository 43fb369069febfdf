package server

import (
	"kvtier/engine"
	"kvtier/wire"
)

// handleStoreLayer takes a STORE_LAYER notice (docs/layerwise.md). It is
// one-way: nothing is sent back, whatever happens. A notice for a lease
// this connection does not hold, or that ended, is dropped — the commit
// writes what no notice covered, and reports an unknown lease itself. Only
// a body that does not decode ends the connection.
func (s *session) handleStoreLayer(body []byte) *requestError {
	var m wire.StoreLayer
	if err := m.Decode(body); err != nil {
		return fatal(wire.StatusBadRequest, "%v", err)
	}
	id := engine.LeaseID(m.Lease)
	if s.owns(id) {
		s.svc.eng.StoreLayer(id, int(m.Layer), engine.Layers{Layers: int(m.Layers), Parts: int(m.Parts)})
	}
	return nil
}
