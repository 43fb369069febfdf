package engine

import (
	"slices"
	"sync"
	"time"

	"kvtier/chunk"
)

// scopeBook remembers the scopes clients registered, so the admin API can
// name a scope id's model and list keys by model. It is bounded: past
// maxBookScopes the least recently registered scope is forgotten (its
// chunks stay cached; only the name is lost).
type scopeBook struct {
	mu     sync.Mutex
	scopes map[uint64]bookEntry
}

type bookEntry struct {
	scope chunk.Scope
	seen  time.Time
}

const maxBookScopes = 4096

func newScopeBook() *scopeBook { return &scopeBook{scopes: make(map[uint64]bookEntry)} }

// note records that scope (whose id is id) was used.
func (b *scopeBook) note(id uint64, scope chunk.Scope) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.scopes[id]; !ok && len(b.scopes) >= maxBookScopes {
		var oldest uint64
		var when time.Time
		for k, e := range b.scopes {
			if when.IsZero() || e.seen.Before(when) {
				oldest, when = k, e.seen
			}
		}
		delete(b.scopes, oldest)
	}
	b.scopes[id] = bookEntry{scope: scope, seen: time.Now()}
}

func (b *scopeBook) lookup(id uint64) (chunk.Scope, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.scopes[id]
	return e.scope, ok
}

func (b *scopeBook) byModel(model string) []uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ids []uint64
	for id, e := range b.scopes {
		if e.scope.Model == model {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// RegisterScope returns the id chunk keys of scope carry (as ScopeID) and
// remembers the scope under it, so that Scope and ScopesOf can name it.
func (e *Engine) RegisterScope(scope chunk.Scope) (uint64, error) {
	id, err := e.ScopeID(scope)
	if err == nil {
		e.book.note(id, scope)
		e.assignOwner(id, scope)
	}
	return id, err
}

// Scope returns the scope registered under id.
func (e *Engine) Scope(id uint64) (chunk.Scope, bool) { return e.book.lookup(id) }

// ScopesOf returns the ids of the registered scopes of model, in order.
func (e *Engine) ScopesOf(model string) []uint64 { return e.book.byModel(model) }
