package engine

import (
	"slices"

	"kvtier/chunk"
)

// ScopesWhere returns, in order, the ids of the registered scopes for
// which keep is true. Tenants list and clear with it: a scope is theirs
// when its namespace is, which only a registered scope tells.
func (e *Engine) ScopesWhere(keep func(chunk.Scope) bool) []uint64 {
	b := e.book
	b.mu.Lock()
	defer b.mu.Unlock()
	var ids []uint64
	for id, en := range b.scopes {
		if keep(en.scope) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}
