package engine

import (
	"kvtier/chunk"
	"kvtier/tier"
)

// Per-layer saves (docs/layerwise.md): a client filling a store lease's
// slots layer by layer says when each layer is final (STORE_LAYER), and
// the engine has the lower tiers that write ranges (the disk tier, a raw
// Redis tier) write that layer of every chunk at once, so that
// COMMIT_STORE leaves only the headers to write.

// StoreLayer says that layer of every chunk of store lease id is final in
// its slot. The first notice starts the lease's per-layer save, with the
// geometry of the scope's format tag, or the one given when the scope has
// no tag; a lease whose chunks have no layer geometry, or an engine
// without a tier that writes ranges, gets none, and its chunks are written
// whole after the commit as without notices. A notice never waits for
// I/O. It reports whether the lease is an active store lease: a notice for
// any other id does nothing.
func (e *Engine) StoreLayer(id LeaseID, layer int, given Layers) bool {
	t := e.leases
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.lookup(id)
	if !ok || t.slots[i].kind != leaseStore {
		return false
	}
	l := t.slots[i]
	if l.feed != nil {
		geo, _ := e.saveGeometry(l.keys, given)
		l.feed.notice(layer, geo)
	}
	if l.save == nil && !l.noSave {
		if geo, ok := e.saveGeometry(l.keys, given); ok {
			l.save = e.mgr.BeginLayerSave(l.keys, l.ids, geo)
		}
		l.noSave = l.save == nil
	}
	if l.save != nil {
		l.save.Layer(layer)
	}
	return true
}

// saveGeometry is the layer geometry a save of keys writes by: the one
// given, or without one the scope's complete tag's, held against the
// format tag of every scope of keys as a stated retrieve's is
// (firstConflict). A tag's layout and parts rule even when the tag has no
// layer count (dtype/layout): a save by spans other than the chunks' real
// ones would write, for "layer 0 final", ranges that also cover layers not
// yet written, and the disk record would then differ from the RAM copy it
// is served for. A tag whose layout interleaves layers with tokens
// (KV_T2D, KV_2TD), or a given geometry that differs from the tag's,
// starts no save (the chunks are written whole at the commit); a scope
// without a tag takes the given one. It allocates nothing.
func (e *Engine) saveGeometry(keys []chunk.Key, given Layers) (tier.LayerGeometry, bool) {
	geo := tier.LayerGeometry{Layers: given.Layers, Parts: given.Parts}
	if given.Layers == 0 {
		geo, _ = e.geometry(keys)
	}
	if !geo.Valid() {
		return tier.LayerGeometry{}, false
	}
	if _, c := e.firstConflict(keys, geo, Scoped{}); c != tagAgrees {
		return tier.LayerGeometry{}, false
	}
	return geo, true
}
