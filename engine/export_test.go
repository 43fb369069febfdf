package engine

// HasLayerSave reports whether store lease id has a per-layer save: what
// the first STORE_LAYER notice decided, without waiting for its I/O.
func (e *Engine) HasLayerSave(id LeaseID) bool {
	t := e.leases
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.lookup(id)
	return ok && t.slots[i].save != nil
}
