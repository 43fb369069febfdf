// Package mem is kvtier's RAM tier: chunk objects live in an off-heap,
// memfd-backed arena (package arena) and are indexed by chunk key. The tier
// evicts by a pluggable policy when the arena is full, never evicts objects
// that readers hold, and exposes arena objects directly so the manager can
// read lower tiers straight into RAM (promotion without a second copy) and a
// connector can map the same bytes.
//
// The tier does not pin (it is not a tier.Pinner). A chunk in RAM is kept
// from eviction by any reference besides the tier's own, and the daemon's
// readers hold theirs under the engine's leases (package engine), the one
// lease mechanism there is: a lease that is released or lapses drops its
// references, and the chunk is evictable again.
package mem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
	"kvtier/tier/policy"
)

// Tier is the RAM tier. All methods are safe for concurrent use.
type Tier struct {
	arena *arena.Arena

	mu     sync.RWMutex // lookups share it; writers and hits (which tell the policy) take it whole
	index  *keyIndex    // chunk key to arena object (keyindex.go)
	policy policy.Policy[chunk.Key]
	busy   func(chunk.Key) bool // policy callback, allocated once

	hits, misses, puts, evictions, removes atomic.Uint64
	bytesRead, bytesWritten                atomic.Uint64

	obs atomic.Pointer[observerBox] // nil: nobody observes

	quota *tier.Quota // per-owner accounting (quota.go); nil for none
}

// The RAM tier has every optional interface of a tier but Pinner.
var (
	_ tier.RAM        = (*Tier)(nil)
	_ tier.Lister     = (*Tier)(nil)
	_ tier.Observable = (*Tier)(nil)
)

// New returns a RAM tier over a, evicting by the named policy.
func New(a *arena.Arena, policyName string) (*Tier, error) {
	p, err := policy.New[chunk.Key](policyName)
	if err != nil {
		return nil, fmt.Errorf("mem tier: %w", err)
	}
	t := &Tier{arena: a, index: newKeyIndex(), policy: p}
	t.busy = t.isBusy
	return t, nil
}

// Arena returns the arena the tier allocates from.
func (t *Tier) Arena() *arena.Arena { return t.arena }

// Name implements tier.Tier.
func (t *Tier) Name() string { return "mem" }

// isBusy reports whether someone besides the tier holds the object; such
// objects are skipped by eviction. Called with t.mu held.
func (t *Tier) isBusy(k chunk.Key) bool {
	id, ok := t.index.Get(&k)
	return ok && t.arena.Refs(id) > 1
}

// Contains implements tier.Container.
func (t *Tier) Contains(key chunk.Key) bool {
	t.mu.RLock()
	ok := t.index.Has(&key)
	t.mu.RUnlock()
	return ok
}

// PrefixContains implements tier.PrefixContainer.
func (t *Tier) PrefixContains(keys []chunk.Key) int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for i := range keys {
		if !t.index.Has(&keys[i]) {
			return i
		}
	}
	return len(keys)
}

// Size implements tier.Tier.
func (t *Tier) Size(key chunk.Key) (int, bool) {
	t.mu.Lock()
	id, ok := t.index.Get(&key)
	t.mu.Unlock()
	if !ok {
		return 0, false
	}
	return t.arena.Size(id), true
}

// Get implements tier.Tier by copying the object out of the arena.
func (t *Tier) Get(_ context.Context, key chunk.Key, dst []byte) (int, error) {
	var ids [1]arena.ID
	if t.Acquire([]chunk.Key{key}, ids[:]) == 0 {
		return 0, tier.ErrNotFound
	}
	defer t.arena.Unref(ids[0])
	src := t.arena.Bytes(ids[0])
	if len(dst) < len(src) {
		return 0, fmt.Errorf("mem tier: destination of %d bytes for object of %d: %w", len(dst), len(src), tier.ErrTooLarge)
	}
	n := copy(dst, src)
	t.bytesRead.Add(uint64(n))
	return n, nil
}

// Acquire takes a reference on the objects of the leading keys that are
// stored, writing their ids to ids (len(ids) >= len(keys)), counts them as
// accessed, and returns how many it acquired. The caller must Unref each id
// on the tier's arena. One lock round trip serves the whole batch.
func (t *Tier) Acquire(keys []chunk.Key, ids []arena.ID) int {
	t.mu.Lock()
	n, bytes := 0, 0
	for ; n < len(keys); n++ {
		id, ok := t.index.Get(&keys[n])
		if !ok || !t.arena.Ref(id) {
			break
		}
		ids[n] = id
		t.policy.Access(keys[n])
		t.quota.Access(keys[n])
		bytes += t.arena.Size(id)
	}
	t.mu.Unlock()
	t.hits.Add(uint64(n))
	t.bytesRead.Add(uint64(bytes)) // handed out to be read, in place or by a copy
	if n < len(keys) {
		t.misses.Add(1)
	}
	return n
}

// Put implements tier.Tier: it copies data into a new arena object.
func (t *Tier) Put(_ context.Context, key chunk.Key, data []byte) error {
	if t.Contains(key) {
		return nil
	}
	id, buf, err := t.ReserveFor(key, len(data))
	if err != nil {
		tier.CountQuotaRefusal(err)
		return err
	}
	copy(buf, data)
	t.Commit(key, id)
	t.arena.Unref(id)
	return nil
}

// Reserve allocates an object of size bytes, evicting unpinned objects as
// needed, and returns it with one reference held by the caller. The object
// is not visible until Commit; the caller drops its reference with the
// arena's Unref whether or not it commits.
func (t *Tier) Reserve(size int) (arena.ID, []byte, error) {
	if int64(size) > t.arena.Capacity() {
		return 0, nil, fmt.Errorf("mem tier: object of %d bytes, arena of %d: %w", size, t.arena.Capacity(), tier.ErrTooLarge)
	}
	for {
		id, err := t.arena.Alloc(size)
		if err == nil {
			return id, t.arena.Bytes(id), nil
		}
		if !errors.Is(err, arena.ErrNoSpace) {
			return 0, nil, fmt.Errorf("mem tier: %w", err)
		}
		if !t.evictOne() {
			return 0, nil, fmt.Errorf("mem tier: every object is pinned: %w", err)
		}
	}
}

// evictOne drops the policy's next unpinned victim and reports whether
// there was one.
func (t *Tier) evictOne() bool {
	t.mu.Lock()
	k, ok := t.policy.Evict(t.busy)
	var id arena.ID
	if ok {
		id, _ = t.index.Get(&k)
		t.index.Delete(&k)
		t.quota.Release(k)
	}
	t.mu.Unlock()
	if !ok {
		return false
	}
	t.dropped(k)
	t.arena.Unref(id)
	t.evictions.Add(1)
	return true
}

// Commit makes a reserved object visible under key. The tier takes its own
// reference; the caller still holds (and must drop) the one from Reserve.
// If key is already stored, the new object is simply not indexed and is
// freed when the caller drops its reference.
func (t *Tier) Commit(key chunk.Key, id arena.ID) {
	t.CommitAfter(key, chunk.Key{}, false, id)
}

// CommitAfter is Commit for a chunk whose parent in its prefix chain (the
// chunk just before it in the prompt) is parent, when hasParent is true. A
// prefix-aware policy (policy.Prefixed) keeps parents while their
// children are cached; the others ignore it.
func (t *Tier) CommitAfter(key, parent chunk.Key, hasParent bool, id arena.ID) {
	t.mu.Lock()
	admitted := false
	if !t.index.Has(&key) && t.arena.Ref(id) {
		t.index.Set(key, id)
		policy.AdmitAfter(t.policy, key, parent, hasParent)
		t.charge(key, id)
		t.puts.Add(1)
		t.bytesWritten.Add(uint64(t.arena.Size(id)))
		admitted = true
	}
	t.mu.Unlock()
	if admitted {
		if o := t.observer(); o != nil {
			o.Admitted(t.Name(), key)
		}
		t.TrimQuota(key)
	}
}

// Remove implements tier.Remover.
func (t *Tier) Remove(key chunk.Key) bool {
	t.mu.Lock()
	id, ok := t.index.Get(&key)
	if ok {
		t.index.Delete(&key)
		t.policy.Remove(key)
		t.quota.Release(key)
	}
	t.mu.Unlock()
	if ok {
		t.arena.Unref(id)
		t.removes.Add(1)
		t.dropped(key)
	}
	return ok
}

// Clear removes every object whose scope matches (all objects when scope
// is 0) and returns how many it removed.
func (t *Tier) Clear(scope uint64) int {
	if scope == 0 {
		return t.clearAll()
	}
	t.mu.Lock()
	var drop []islot
	t.index.Range(func(k chunk.Key, id arena.ID) bool {
		if scope == 0 || k.Scope == scope {
			drop = append(drop, islot{k, id})
		}
		return true
	})
	obs := t.observer()
	for _, e := range drop { // not within Range: a delete moves keys
		t.index.Delete(&e.key)
		t.policy.Remove(e.key)
		t.quota.Release(e.key)
		if obs != nil {
			obs.Dropped(t.Name(), e.key)
		}
	}
	t.mu.Unlock()
	for _, e := range drop {
		t.arena.Unref(e.id)
	}
	t.removes.Add(uint64(len(drop)))
	return len(drop)
}

// clearAll is Clear of every scope: one walk drops each object, then the
// index starts again at its smallest, instead of a copy of every key
// (32 bytes each, under the lock) and a delete of each from a table that
// would keep its peak size.
func (t *Tier) clearAll() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	obs := t.observer()
	n := t.index.Len()
	t.index.Range(func(k chunk.Key, id arena.ID) bool {
		t.policy.Remove(k)
		t.quota.Release(k)
		if obs != nil {
			obs.Dropped(t.Name(), k)
		}
		t.arena.Unref(id) // the arena's lock nests in t.mu, as for Ref
		return true
	})
	t.index.reset()
	t.removes.Add(uint64(n))
	return n
}

// List implements tier.Lister.
func (t *Tier) List(scope uint64, fn func(chunk.Key, int) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.index.Range(func(k chunk.Key, id arena.ID) bool {
		return (scope != 0 && k.Scope != scope) || fn(k, t.arena.Size(id))
	})
}

// Stats implements tier.StatsReporter.
func (t *Tier) Stats() tier.Stats {
	t.mu.Lock()
	objects := t.index.Len()
	t.mu.Unlock()
	return tier.Stats{
		Name:         "mem",
		Capacity:     t.arena.Capacity(),
		Used:         t.arena.Used(),
		Objects:      int64(objects),
		Pinned:       t.arena.Pinned(),
		Hits:         t.hits.Load(),
		Misses:       t.misses.Load(),
		Puts:         t.puts.Load(),
		Evictions:    t.evictions.Load(),
		Removes:      t.removes.Load(),
		BytesRead:    t.bytesRead.Load(),
		BytesWritten: t.bytesWritten.Load(),
	}
}

// Close implements io.Closer: it drops every object. The arena belongs to the caller.
func (t *Tier) Close() error {
	t.Clear(0)
	return nil
}

// observerBox holds the observer for an atomic pointer.
type observerBox struct{ o tier.Observer }

// SetObserver implements tier.Observable.
func (t *Tier) SetObserver(o tier.Observer) { t.obs.Store(&observerBox{o}) }

func (t *Tier) observer() tier.Observer {
	if b := t.obs.Load(); b != nil {
		return b.o
	}
	return nil
}

func (t *Tier) dropped(k chunk.Key) {
	if o := t.observer(); o != nil {
		o.Dropped(t.Name(), k)
	}
}
