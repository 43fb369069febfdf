package tier

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
)

// TierSync is what Manager.Sync found for one lower tier. The chunks
// stored before Sync are all in the tier when Pending and Missing are both
// 0: as durably as the tier's Put promises (the disk tier's Put returns
// once its record is fdatasync'ed, unless it was opened with SyncNone).
type TierSync struct {
	Tier string
	// Pending is how many writes queued before Sync were still unfinished
	// when its context ended.
	Pending int
	// Redone is how many writes that had been dropped (a full queue) or
	// refused (an error) Sync wrote again, successfully.
	Redone int
	// Missing is how many chunks the tier lacks for good: their write was
	// dropped or refused, and writing them again failed, or they had left
	// RAM by then, or there were too many to remember. Such a chunk is
	// counted by every later Sync too, until the tier holds it (stored
	// again) or it is removed or cleared: each later Sync covers it as well.
	Missing int
}

// missedSet remembers the keys whose write to one lower tier was dropped or
// refused, up to maxMissed of them; beyond that it only counts them, by
// scope for up to maxOverScopes scopes (so that a Sync narrowed to some
// scopes counts only theirs), and in one count for the rest.
type missedSet struct {
	mu   sync.Mutex
	keys map[chunk.Key]struct{}
	over map[uint64]int // keys beyond maxMissed, by scope
	lost int            // keys beyond maxMissed whose scope over had no room for
}

// maxMissed bounds a missedSet: 64k keys, about 4 MiB at most.
const maxMissed = 1 << 16

// maxOverScopes bounds the scopes a missedSet counts separately beyond
// maxMissed keys.
const maxOverScopes = 4096

func (s *missedSet) add(k chunk.Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = make(map[chunk.Key]struct{})
	}
	if len(s.keys) >= maxMissed {
		s.countOver(k.Scope, 1)
		return
	}
	s.keys[k] = struct{}{}
}

// countOver counts n keys of scope beyond maxMissed. Called with s.mu held.
func (s *missedSet) countOver(scope uint64, n int) {
	if _, ok := s.over[scope]; !ok && len(s.over) >= maxOverScopes {
		s.lost += n
		return
	}
	if s.over == nil {
		s.over = make(map[uint64]int)
	}
	s.over[scope] += n
}

// take empties the set and returns what it held.
func (s *missedSet) take() (keys map[chunk.Key]struct{}, over map[uint64]int, lost int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys, over, lost = s.keys, s.over, s.lost
	s.keys, s.over, s.lost = nil, nil, 0
	return keys, over, lost
}

// forget drops the keys match selects: a chunk removed or cleared on
// purpose is no longer owed to any tier.
func (s *missedSet) forget(match func(chunk.Key) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.keys {
		if match(k) {
			delete(s.keys, k)
		}
	}
}

// forgetScope drops the keys of scope (every key when scope is 0) and
// its count beyond maxMissed: a cleared scope owes nothing to any tier.
func (s *missedSet) forgetScope(scope uint64) {
	s.forget(func(k chunk.Key) bool { return scope == 0 || k.Scope == scope })
	s.mu.Lock()
	defer s.mu.Unlock()
	if scope == 0 {
		s.over, s.lost = nil, 0
		return
	}
	delete(s.over, scope)
}

// drain empties the set of keys but, unlike take, keeps its counts of
// those beyond maxMissed, adding over and lost to them, and returns the
// keys. It serves lowerTier.gone, whose chunks every Sync reports until
// they are mended, and whose uncounted ones cannot be told apart and so
// are reported until the daemon restarts or their scope is cleared.
func (s *missedSet) drain(over map[uint64]int, lost int) map[chunk.Key]struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := s.keys
	s.keys = nil
	for sc, n := range over {
		s.countOver(sc, n)
	}
	s.lost += lost
	return keys
}

// overflow returns how many keys beyond maxMissed the set counts in the
// scopes visible selects (every scope when visible is nil), plus those
// whose scope it could not tell: they may be any scope's.
func (s *missedSet) overflow(visible func(uint64) bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.lost
	for sc, c := range s.over {
		if visible == nil || visible(sc) {
			n += c
		}
	}
	return n
}

// Sync returns once every chunk stored before it was called is in every
// lower tier, or reports per tier what is not: it waits for the writes
// queued before it (not for those queued after, so a busy daemon cannot
// keep it waiting), writes again the chunks whose write was dropped on a
// full queue or refused. When ctx ends first, the writes still queued
// count as Pending and ctx's error is returned with the report.
func (m *Manager) Sync(ctx context.Context) ([]TierSync, error) {
	return m.SyncScopes(ctx, nil)
}

// SyncScopes is Sync with Redone and Missing narrowed to the chunks of
// the scopes visible selects (all of them when visible is nil): a
// tenant's flush learns nothing of other tenants' chunks, and their
// losses do not make its reply say "not durable". It waits and writes
// again as Sync does, for every scope. Pending is not narrowed: it
// counts every write queued before the call and unfinished when ctx
// ended, whoever stored it (a queue holds no index by scope).
func (m *Manager) SyncScopes(ctx context.Context, visible func(scope uint64) bool) ([]TierSync, error) {
	m.syncMu.Lock()
	defer m.syncMu.Unlock()
	out := make([]TierSync, len(m.lower))
	for i, lt := range m.lower {
		out[i].Tier = lt.Name()
	}
	// Writes are counted in one of two generations. A write still counted
	// in the generation Sync is about to start was queued before some
	// earlier Sync whose context ended: wait for it too.
	old := make([]uint32, len(m.lower))
	for i, lt := range m.lower {
		next := (lt.gen.Load() + 1) & 1
		if n := waitZero(ctx, &lt.inflight[next]); n > 0 {
			out[i].Pending = n + int(lt.inflight[1-next].Load())
			continue
		}
		old[i] = lt.gen.Add(1) - 1
	}
	for i, lt := range m.lower {
		if out[i].Pending == 0 {
			out[i].Pending = waitZero(ctx, &lt.inflight[old[i]&1])
		}
	}
	for i, lt := range m.lower {
		m.redo(ctx, lt, &out[i], visible)
	}
	return out, ctx.Err()
}

// waitZero waits until n is 0 or ctx ends, and returns n then.
func waitZero(ctx context.Context, n interface{ Load() int64 }) int {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		v := n.Load()
		if v <= 0 {
			return 0
		}
		select {
		case <-ctx.Done():
			return int(v)
		case <-tick.C:
		}
	}
}

// redo writes again, synchronously, the chunks whose write to lt was
// dropped or refused, if they are still in RAM and lt still lacks them.
// Those that left RAM move to lt.gone; those in lt.gone that were stored
// again since leave it. r counts only the chunks of scopes visible
// selects (all when nil).
func (m *Manager) redo(ctx context.Context, lt *lowerTier, r *TierSync, visible func(uint64) bool) {
	keys, over, lost := lt.missed.take()
	gone := lt.gone.drain(over, lost)
	r.Missing += lt.gone.overflow(visible)
	if keys == nil && len(gone) > 0 {
		keys = make(map[chunk.Key]struct{}, len(gone))
	}
	for k := range gone {
		keys[k] = struct{}{}
	}
	var id [1]arena.ID
	for k := range keys {
		seen := visible == nil || visible(k.Scope)
		if Contains(lt.Tier, k) {
			continue // written since, by a later store of the same chunk
		}
		if ctx.Err() != nil {
			lt.missed.add(k) // for the next Sync
			r.count(seen, false)
			continue
		}
		if m.ram.Acquire([]chunk.Key{k}, id[:]) != 1 {
			lt.gone.add(k)
			r.count(seen, false)
			continue
		}
		err := lt.Put(ctx, k, m.arena.Bytes(id[0]))
		m.arena.Unref(id[0])
		if errors.Is(err, ErrRangeOpen) { // still being saved by layers: not durable yet, not refused
			lt.missed.add(k)
			r.count(seen, false)
			continue
		}
		if err != nil {
			lt.failed.Add(1)
			lt.missed.add(k)
			r.count(seen, false)
			lt.redoLog.Log(m.opts.Logger, slog.LevelWarn, "lower tier write failed again", "tier", lt.Name(), "key", k, "err", err)
			continue
		}
		r.count(seen, true)
	}
}

// count adds one chunk to r as redone or missing when it is one of the
// scopes r reports on.
func (r *TierSync) count(seen, redone bool) {
	switch {
	case !seen:
	case redone:
		r.Redone++
	default:
		r.Missing++
	}
}
