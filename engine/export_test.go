package engine

import (
	"kvtier/chunk"
	"kvtier/tier"
)

// HasLayerSave reports whether store lease id has a per-layer save: what
// the first STORE_LAYER notice decided, without waiting for its I/O.
func (e *Engine) HasLayerSave(id LeaseID) bool {
	t := e.leases
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.lookup(id)
	return ok && t.slots[i].save != nil
}

// SaveGeometry is the geometry a per-layer save of keys would write by,
// given the client's (saveGeometry).
func (e *Engine) SaveGeometry(keys []chunk.Key, given Layers) (tier.LayerGeometry, bool) {
	return e.saveGeometry(keys, given)
}

// Geometry is the geometry of keys' scope's format tag (geometry).
func (e *Engine) Geometry(keys []chunk.Key) (tier.LayerGeometry, bool) { return e.geometry(keys) }
