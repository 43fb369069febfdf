package tier

import (
	"context"

	"kvtier/arena"
	"kvtier/chunk"
)

// LowerRange is a chunk held below RAM by a tier that reads ranges, found
// by Manager.LowerRange: a daemon serving RETRIEVE_RANGES reads just the
// ranges asked of it from that tier, instead of promoting the whole chunk
// into RAM before its first range goes out (docs/layerwise.md, peers).
type LowerRange struct {
	rr   RangeReader
	key  chunk.Key
	size int
}

// LowerRange finds key's chunk in the first lower tier holding it (the
// node-local tiers only when local is set, as AcquireLocal) and returns
// it when that tier reads ranges and layerwise loads would read it so
// (RangeChooser). It reads nothing and holds nothing.
func (m *Manager) LowerRange(key chunk.Key, local bool) (LowerRange, bool) {
	upTo := len(m.lower)
	if local {
		upTo = m.local
	}
	t := m.holder(key, upTo)
	if t < 0 {
		return LowerRange{}, false
	}
	rr, ok := readsRanges(m.lower[t].Tier)
	if !ok {
		return LowerRange{}, false
	}
	size, ok := m.lower[t].Size(key)
	if !ok {
		return LowerRange{}, false
	}
	return LowerRange{rr: rr, key: key, size: size}, true
}

// Size returns the chunk's length.
func (l LowerRange) Size() int { return l.size }

// Open prepares range reads of the chunk into dst, which must be Size
// bytes long; ranges read through it are verified by the tier.
func (l LowerRange) Open(ctx context.Context, dst []byte) (RangeRead, error) {
	return l.rr.OpenRange(ctx, l.key, dst)
}

// AcquireRanged is Acquire (AcquireLocal when local is set) for a reader
// of ranges: RAM chunks are referenced, and the first chunk of the prefix
// held only by a lower tier that reads ranges is not promoted but
// returned as lower, at index at of the hit, when take accepts its size
// (take reserves what the reads need); ids[at] is then left unset. Chunks
// after it are promoted as Acquire does. at is -1 when no chunk is read
// so. It returns the length of the hit.
func (m *Manager) AcquireRanged(ctx context.Context, keys []chunk.Key, ids []arena.ID, local bool, take func(size int) bool) (n, at int, lower LowerRange, err error) {
	upTo := len(m.lower)
	if local {
		upTo = m.local
	}
	n = m.ram.Acquire(keys, ids)
	if n == len(keys) || upTo == 0 {
		return n, -1, LowerRange{}, nil
	}
	var first link
	if n > 0 {
		first = link{keys[n-1], true}
	}
	lower, ok := m.LowerRange(keys[n], local)
	if !ok || !take(lower.Size()) {
		got, err := m.promote(ctx, first, keys[n:], ids[n:], upTo)
		return n + got, -1, LowerRange{}, err
	}
	at = n
	n++
	n += m.ram.Acquire(keys[n:], ids[n:]) // promote takes its first key as a RAM miss
	if n == len(keys) {
		return n, at, lower, nil
	}
	got, err := m.promote(ctx, link{keys[n-1], true}, keys[n:], ids[n:], upTo)
	return n + got, at, lower, err
}
