package engine

import (
	"context"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
)

// Operations on chunk keys, for the daemon's protocols: a client names
// chunks by token ids (turned into keys by Keys), by engine hashes or by
// raw keys, so the protocol resolves keys first and then calls these.

// MaxTiers bounds the tiers of one engine: RAM and the tiers below it.
const MaxTiers = tier.MaxTiers

// Errors the engine's operations wrap, for callers that tell them apart
// (the daemon maps them to protocol statuses).
var (
	ErrNoSpace  = arena.ErrNoSpace // RAM is full of chunks that are in use
	ErrQuota    = tier.ErrQuota    // a tenant's quota is full of its chunks in use
	ErrTooLarge = tier.ErrTooLarge // a chunk larger than a tier
	ErrClosed   = tier.ErrClosed   // the engine is shutting down
)

// TierCount returns how many tiers there are, RAM first.
func (e *Engine) TierCount() int { return len(e.mgr.Tiers()) }

// TierNames returns the tiers' names, RAM first.
func (e *Engine) TierNames() []string {
	ts := e.mgr.Tiers()
	names := make([]string, len(ts))
	for i, t := range ts {
		names[i] = t.Name()
	}
	return names
}

// LookupKeys returns how many leading keys are cached anywhere, and how
// many of those each tier (0 = RAM) would serve.
func (e *Engine) LookupKeys(keys []chunk.Key) (n int, byTier [MaxTiers]int) {
	n, byTier, _ = e.mgr.Lookup(keys)
	return n, byTier
}

// LookupKeysLocal is LookupKeys over RAM and the node-local tiers only:
// what this daemon serves another daemon's P2P tier.
func (e *Engine) LookupKeysLocal(keys []chunk.Key) (n int, byTier [MaxTiers]int) {
	n, byTier, _ = e.mgr.LookupLocal(keys)
	return n, byTier
}

// SizeLocal is Size over RAM and the node-local tiers only.
func (e *Engine) SizeLocal(key chunk.Key) (int, bool) { return e.mgr.SizeLocal(key) }

// InRAM reports whether key's chunk is in RAM.
func (e *Engine) InRAM(key chunk.Key) bool { return e.mgr.RAM().Contains(key) }

// Size returns the length of key's chunk in the fastest tier holding it.
func (e *Engine) Size(key chunk.Key) (int, bool) { return e.mgr.Size(key) }

// PrefetchKeys asks for keys to be promoted into RAM in the background and
// reports whether the request was queued.
func (e *Engine) PrefetchKeys(keys []chunk.Key) bool { return e.mgr.Prefetch(keys) }

// Clear drops the chunks of scope (every scope for 0) from the tiers that
// can enumerate them and returns how many each tier dropped, in TierNames
// order, and the names of the tiers that kept theirs (shared remote
// stores cannot find a scope's chunks).
func (e *Engine) Clear(scope uint64) (removed []int, notCleared []string) {
	return e.mgr.Clear(scope)
}

// TierSync is what a flush found for one tier below RAM.
type TierSync struct {
	Tier    string
	Pending int // writes still unfinished when the flush's context ended
	Redone  int // dropped or refused writes the flush wrote again
	Missing int // chunks the tier lacks for good (gone from RAM as well)
}

// How long a flush may wait: a default for requests that name no bound,
// and a cap on those that do. The protocol's FLUSH and the admin API's
// flush both apply FlushWait.
const (
	DefaultFlushWait = time.Minute
	MaxFlushWait     = 10 * time.Minute
)

// FlushWait turns a requested bound on a flush (0: none) into the wait to
// use.
func FlushWait(asked time.Duration) time.Duration {
	if asked <= 0 {
		return DefaultFlushWait
	}
	return min(asked, MaxFlushWait)
}

// Sync waits until every chunk stored before the call is in the tiers
// below RAM, writing again the chunks whose queued write was dropped or
// refused, and reports per tier what is not. Running out of time shows as
// pending writes.
func (e *Engine) Sync(ctx context.Context) []TierSync {
	rep, _ := e.mgr.Sync(ctx)
	out := make([]TierSync, 0, len(rep))
	for _, t := range rep {
		out = append(out, TierSync{Tier: t.Tier, Pending: t.Pending, Redone: t.Redone, Missing: t.Missing})
	}
	return out
}

// Flush waits until every queued write to the tiers below RAM was
// attempted and writes again those dropped or refused (see
// tier.Manager.Flush). It returns nil only when every stored chunk is in
// every lower tier that takes writes; otherwise an error wrapping
// ErrNotDurable, or ctx's.
func (e *Engine) Flush(ctx context.Context) error { return e.mgr.Flush(ctx) }

// ErrNotDurable is wrapped by Flush's error when some stored chunk is
// missing from a lower tier.
var ErrNotDurable = tier.ErrNotDurable

// Observer learns which chunks the local tiers (RAM and disk) admit and
// drop. Its methods may run under a tier's lock: they must return at once
// and never call back into the engine.
type Observer interface {
	Admitted(tier string, key chunk.Key)
	Dropped(tier string, key chunk.Key)
}

// SetObserver makes every tier that reports admissions and drops report
// them to o.
func (e *Engine) SetObserver(o Observer) {
	for _, t := range e.mgr.Tiers() {
		if ob, ok := t.(tier.Observable); ok {
			ob.SetObserver(o)
		}
	}
}

// Observers returns one Observer that reports to each of obs in turn,
// so that several listeners (the router's KV events, the cluster's chunk
// stream) follow the same tiers; nil entries are skipped.
func Observers(obs ...Observer) Observer {
	var kept observers
	for _, o := range obs {
		if o != nil {
			kept = append(kept, o)
		}
	}
	return kept
}

type observers []Observer

func (os observers) Admitted(tier string, key chunk.Key) {
	for _, o := range os {
		o.Admitted(tier, key)
	}
}

func (os observers) Dropped(tier string, key chunk.Key) {
	for _, o := range os {
		o.Dropped(tier, key)
	}
}

// ListChunks calls fn with each chunk of each of scopes (0 stands for
// every scope) that a tier able to enumerate its chunks holds, tier by
// tier, with the tier's name and the chunk's size, until fn returns false.
// fn runs under the tier's lock: it must be quick and must not call into
// the engine.
func (e *Engine) ListChunks(scopes []uint64, fn func(tier string, key chunk.Key, size int) bool) {
	for _, t := range e.mgr.Tiers() {
		l, ok := t.(tier.Lister)
		if !ok {
			continue
		}
		name, more := t.Name(), true
		for _, sc := range scopes {
			l.List(sc, func(k chunk.Key, size int) bool {
				more = fn(name, k, size)
				return more
			})
			if !more {
				return
			}
		}
	}
}

// Writes is a batch of chunks written into RAM in place (the TCP STORE
// path reads each chunk's bytes from the network straight into its
// reservation) and committed together. A connection reuses one, so the
// batch allocates nothing once warm.
type Writes struct {
	e    *Engine
	keys []chunk.Key
	ids  []arena.ID
	// A chained batch (After) is a run of consecutive chunks of one
	// prompt, following up when hasUp.
	up             chunk.Key
	chained, hasUp bool
}

// Begin empties w for a new batch on e: a batch of unrelated chunks until
// After says otherwise.
func (w *Writes) Begin(e *Engine) {
	w.e, w.keys, w.ids = e, w.keys[:0], w.ids[:0]
	w.chained, w.hasUp = false, false
}

// After makes the batch a run of consecutive chunks of one prompt, in the
// order they are reserved, following parent (the chunk just before the
// first of them) when ok, else starting its prompt. The prefix-aware
// eviction policies then learn each chunk's parent, as they do from the
// engine's own stores: without it every chunk of the batch is a root and
// a leaf, which eviction may take from the middle of a prompt.
func (w *Writes) After(parent chunk.Key, ok bool) {
	w.chained, w.up, w.hasUp = true, parent, ok
}

// Reserve reserves size bytes of RAM for key's chunk and returns them to
// be filled.
func (w *Writes) Reserve(key chunk.Key, size int) ([]byte, error) {
	id, buf, err := w.e.mgr.ReserveFor(key, size)
	if err != nil {
		return nil, err
	}
	w.keys, w.ids = append(w.keys, key), append(w.ids, id)
	return buf, nil
}

// Skip notes, in a chained batch (After), that key's chunk is in the run
// but is not written (it is cached already): it reserves nothing and stays
// the parent of the chunk after it. In a batch of unrelated chunks it does
// nothing.
func (w *Writes) Skip(key chunk.Key) {
	if w.chained {
		w.keys, w.ids = append(w.keys, key), append(w.ids, 0) // id 0: CommitRun skips it
	}
}

// Commit makes the reserved chunks visible and queues them for the tiers
// below RAM. The batch is empty afterwards, whatever happens.
func (w *Writes) Commit() error {
	err := w.commit()
	w.keys, w.ids = w.keys[:0], w.ids[:0]
	return err
}

// commit hands the reservations to the manager, as a run when chained.
func (w *Writes) commit() error {
	switch {
	case !w.chained:
		return w.e.mgr.Commit(w.keys, w.ids)
	case w.hasUp:
		return w.e.mgr.CommitRunAfter(w.up, w.keys, w.ids)
	}
	return w.e.mgr.CommitRun(w.keys, w.ids)
}

// Abort returns the reservations; none of them becomes visible.
func (w *Writes) Abort() {
	a := w.e.arenaOf()
	for _, id := range w.ids {
		if id != 0 { // Skip
			a.Unref(id)
		}
	}
	w.keys, w.ids = w.keys[:0], w.ids[:0]
}

// Reads holds references on chunks read in place from RAM (the TCP
// RETRIEVE path writes each chunk to the network straight from the
// arena) until Release. A connection reuses one.
type Reads struct {
	e   *Engine
	ids []arena.ID
}

// Acquire references the RAM chunks of the leading keys cached anywhere,
// promoting lower-tier hits, and returns how many it holds. A tier failing
// after some chunks ends the prefix there without an error.
func (e *Engine) Acquire(ctx context.Context, keys []chunk.Key, r *Reads) (int, error) {
	r.e = e
	r.ids = growIDs(r.ids, len(keys))
	n, err := e.mgr.Acquire(ctx, keys, r.ids)
	r.ids = r.ids[:n]
	return n, err
}

// AcquireLocal is Acquire from RAM and the node-local tiers only, for a
// peer's P2P tier.
func (e *Engine) AcquireLocal(ctx context.Context, keys []chunk.Key, r *Reads) (int, error) {
	r.e = e
	r.ids = growIDs(r.ids, len(keys))
	n, err := e.mgr.AcquireLocal(ctx, keys, r.ids)
	r.ids = r.ids[:n]
	return n, err
}

// Len returns how many chunks r holds.
func (r *Reads) Len() int { return len(r.ids) }

// Size returns chunk j's length.
func (r *Reads) Size(j int) int { return r.e.arenaOf().Size(r.ids[j]) }

// Bytes returns chunk j's bytes, valid until Release.
func (r *Reads) Bytes(j int) []byte { return r.e.arenaOf().Bytes(r.ids[j]) }

// Release drops the references.
func (r *Reads) Release() {
	if r.e == nil {
		return
	}
	a := r.e.arenaOf()
	for _, id := range r.ids {
		a.Unref(id)
	}
	r.ids = r.ids[:0]
}

// ArenaFd returns the memfd of the RAM tier's arena, which the daemon
// passes to local clients so they map the same memory.
func (e *Engine) ArenaFd() int { return e.arenaOf().Fd() }

// ArenaBytes returns the capacity of the RAM tier's arena.
func (e *Engine) ArenaBytes() int64 { return e.arenaOf().Capacity() }

func (e *Engine) arenaOf() *arena.Arena { return e.mgr.RAM().Arena() }
