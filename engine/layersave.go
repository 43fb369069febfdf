package engine

import "kvtier/tier"

// Per-layer saves (docs/layerwise.md): a client filling a store lease's
// slots layer by layer says when each layer is final (STORE_LAYER), and
// the engine has the disk tier write that layer of every chunk at once,
// so that COMMIT_STORE leaves only the headers to write.

// StoreLayer says that layer of every chunk of store lease id is final in
// its slot. The first notice starts the lease's per-layer save, with the
// geometry given, or the scope's when given is zero; a lease whose chunks
// have no layer geometry, or an engine without a tier that writes ranges,
// gets none, and its chunks are written whole after the commit as
// without notices. A notice never waits for I/O. It reports whether the
// lease is an active store lease: a notice for any other id does nothing.
func (e *Engine) StoreLayer(id LeaseID, layer int, given Layers) bool {
	t := e.leases
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.lookup(id)
	if !ok || t.slots[i].kind != leaseStore {
		return false
	}
	l := t.slots[i]
	if l.save == nil && !l.noSave {
		geo := tier.LayerGeometry{Layers: given.Layers, Parts: given.Parts}
		if given.Layers == 0 {
			geo, _ = e.geometry(l.keys)
		}
		l.save = e.mgr.BeginLayerSave(l.keys, l.ids, geo)
		l.noSave = l.save == nil
	}
	if l.save != nil {
		l.save.Layer(layer)
	}
	return true
}
