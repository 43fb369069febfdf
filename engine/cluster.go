package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
)

// Operations the cluster's controller asks a daemon for by key (pin,
// clear a tier, copy between tiers, drop), on the daemon's local tiers:
// RAM and the node-local tiers below it. Shared remote stores are left
// alone: other daemons read them too. None of these is on a hot path.

// ErrNotLocalTier is returned for a tier name that is neither RAM nor a
// node-local tier of this engine.
var ErrNotLocalTier = errors.New("engine: not a local tier")

// PinKey keeps key's chunk from eviction for ttl (the lease rule
// applies) wherever this daemon holds it: in RAM by an arena reference
// under a lease, which Release ends early, and on each local lower tier
// holding it by the tier's pin, a deadline that only lapses. It returns
// the lease (0 when the chunk is not in RAM) and the names of the tiers
// that pinned it, none when no local tier holds it.
func (e *Engine) PinKey(key chunk.Key, ttl time.Duration) (LeaseID, []string) {
	ttl = e.leases.ttl(ttl)
	keys := []chunk.Key{key}
	var where []string
	var id LeaseID
	i, l := e.leases.build(leaseLookup)
	l.ids = append(l.ids[:0], 0)
	if e.mgr.RAM().Acquire(keys, l.ids) == 1 {
		if id = e.leases.activate(i, ttl); id != 0 {
			where = append(where, e.mgr.RAM().Name())
		}
	} else {
		l.ids = l.ids[:0]
		e.leases.discard(i)
	}
	for _, t := range e.localLower() {
		if tier.Pin(t, keys, ttl) == 1 {
			where = append(where, t.Name())
		}
	}
	return id, where
}

// ClearTier drops the chunks of scope (every scope for 0) from the tier
// called name, RAM or a local lower tier, and returns how many it
// dropped. Tiers that cannot list their chunks are an error.
func (e *Engine) ClearTier(scope uint64, name string) (int, error) {
	i, t, err := e.localTier(name)
	if err != nil {
		return 0, err
	}
	if i == 0 {
		return e.mgr.RAM().Clear(scope), nil
	}
	l, ok := t.(tier.Lister)
	if _, canRemove := t.(tier.Remover); !ok || !canRemove {
		return 0, fmt.Errorf("tier %q cannot list and remove its chunks", name)
	}
	var keys []chunk.Key
	l.List(scope, func(k chunk.Key, _ int) bool { keys = append(keys, k); return true })
	n := 0
	for _, k := range keys {
		if tier.Remove(t, k) {
			n++
		}
	}
	return n, nil
}

// CopyResult counts what CopyToTier did.
type CopyResult struct {
	Copied  int // chunks written into the destination tier
	Already int // chunks the destination tier held already
	Missing int // chunks no local tier holds
	Dropped int // for a move: chunks dropped from the other local tiers
}

// CopyToTier puts the chunks of keys into the local tier called name:
// into RAM by promotion from a lower tier, into a lower tier by writing
// the bytes of the fastest local tier holding them. With move, a chunk
// then leaves the other local tiers, so that only name holds it.
func (e *Engine) CopyToTier(ctx context.Context, keys []chunk.Key, name string, move bool) (CopyResult, error) {
	var res CopyResult
	dst, t, err := e.localTier(name)
	if err != nil {
		return res, err
	}
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if tier.Contains(t, k) {
			res.Already++
		} else {
			ok, err := e.copyInto(ctx, k, dst, t)
			if err != nil {
				return res, fmt.Errorf("chunk %v into %s: %w", k, name, err)
			}
			if !ok {
				res.Missing++
				continue
			}
			res.Copied++
		}
		if move && e.dropExcept(k, dst) {
			res.Dropped++
		}
	}
	return res, nil
}

// copyInto copies k into local tier dst (t) and reports whether a local
// tier held it.
func (e *Engine) copyInto(ctx context.Context, k chunk.Key, dst int, t tier.Tier) (bool, error) {
	ids := []arena.ID{0}
	if dst == 0 {
		// Promotion from the node-local tiers into RAM.
		n, err := e.mgr.AcquireLocal(ctx, []chunk.Key{k}, ids)
		if n == 1 {
			e.arenaOf().Unref(ids[0])
		}
		return n == 1, err
	}
	if e.mgr.RAM().Acquire([]chunk.Key{k}, ids) == 1 {
		defer e.arenaOf().Unref(ids[0])
		return true, t.Put(ctx, k, e.arenaOf().Bytes(ids[0]))
	}
	for _, src := range e.localLower() {
		size, ok := src.Size(k)
		if !ok || src == t {
			continue
		}
		buf := make([]byte, size)
		n, err := src.Get(ctx, k, buf)
		if err != nil {
			continue // gone or corrupt there: another tier may have it
		}
		return true, t.Put(ctx, k, buf[:n])
	}
	return false, nil
}

// DropLocal removes the chunks of keys from RAM and the local lower
// tiers and returns how many of them any of those tiers held.
func (e *Engine) DropLocal(keys []chunk.Key) int {
	n := 0
	for _, k := range keys {
		if e.dropExcept(k, -1) {
			n++
		}
	}
	return n
}

// dropExcept removes k from every local tier but the one at index keep
// (0 is RAM) and reports whether any held it.
func (e *Engine) dropExcept(k chunk.Key, keep int) bool {
	found := false
	if keep != 0 {
		found = e.mgr.RAM().Remove(k)
	}
	for i, t := range e.localLower() {
		if i+1 != keep {
			found = tier.Remove(t, k) || found
		}
	}
	return found
}

// localTier returns the index (0 for RAM) and the tier called name,
// which must be RAM or a node-local lower tier.
func (e *Engine) localTier(name string) (int, tier.Tier, error) {
	if ram := e.mgr.RAM(); name == ram.Name() {
		return 0, ram, nil
	}
	for i, t := range e.localLower() {
		if t.Name() == name {
			return i + 1, t, nil
		}
	}
	return 0, nil, fmt.Errorf("tier %.40q: %w of this daemon (it has %v)", name, ErrNotLocalTier, e.localNames())
}

func (e *Engine) localNames() []string {
	names := []string{e.mgr.RAM().Name()}
	for _, t := range e.localLower() {
		names = append(names, t.Name())
	}
	return names
}

// localLower returns the node-local lower tiers (the disk tier), which
// lead the lower tiers.
func (e *Engine) localLower() []tier.Tier {
	var out []tier.Tier
	for _, t := range e.mgr.Tiers()[1:] {
		if _, ok := t.(tier.NodeLocal); !ok {
			break
		}
		out = append(out, t)
	}
	return out
}
