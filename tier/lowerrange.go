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
	wr   WindowReader // nil when the tier reads ranges only into a buffer of the chunk's size
	key  chunk.Key
	size int
	// At is the chunk's index in the hit (AcquireRanged).
	At     int
	upTo   int  // the lower tiers Promote may read from
	parent link // the chunk's parent in the hit, for Promote's policy
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
	wr, _ := m.lower[t].Tier.(WindowReader)
	return LowerRange{rr: rr, wr: wr, key: key, size: size, upTo: upTo}, true
}

// Size returns the chunk's length.
func (l LowerRange) Size() int { return l.size }

// Open prepares range reads of the chunk into dst, which must be Size
// bytes long; ranges read through it are verified by the tier.
func (l LowerRange) Open(ctx context.Context, dst []byte) (RangeRead, error) {
	return l.rr.OpenRange(ctx, l.key, dst)
}

// Windows reports whether the tier reads the chunk's ranges into buffers
// of their own (OpenWindows), so that no buffer of the chunk's size is
// needed.
func (l LowerRange) Windows() bool { return l.wr != nil }

// OpenWindows prepares window reads of the chunk; only when Windows.
func (l LowerRange) OpenWindows(ctx context.Context) (WindowRead, error) {
	return l.wr.OpenWindows(ctx, l.key)
}

// AcquireRanged is Acquire (AcquireLocal when local is set) for a reader
// of ranges: RAM chunks are referenced, and every chunk of the prefix
// held only by a lower tier that reads ranges is not promoted but
// appended to lowers, with its index in the hit (At); ids[At] is then
// left unset. From the first chunk that no tier holds so (a store read
// whole), the rest of the prefix is promoted as Acquire does. It returns
// the length of the hit and lowers.
func (m *Manager) AcquireRanged(ctx context.Context, keys []chunk.Key, ids []arena.ID, local bool, lowers []LowerRange) (n int, _ []LowerRange, err error) {
	upTo := len(m.lower)
	if local {
		upTo = m.local
	}
	n = m.ram.Acquire(keys, ids)
	if n == len(keys) || upTo == 0 {
		return n, lowers, nil
	}
	for n < len(keys) { // keys[n] is not in RAM
		var up link
		if n > 0 {
			up = link{keys[n-1], true}
		}
		l, ok := m.LowerRange(keys[n], local)
		if !ok {
			got, err := m.promote(ctx, up, keys[n:], ids[n:], upTo)
			return n + got, lowers, err
		}
		l.At, l.parent = n, up
		lowers = append(lowers, l)
		ids[n] = 0
		n++
		n += m.ram.Acquire(keys[n:], ids[n:])
	}
	return n, lowers, nil
}

// Promote reads l's chunk whole into RAM, as Acquire would have, and
// references it in *id: for a reader of ranges that cannot read them
// from the lower tier after all (no scratch memory left).
func (m *Manager) Promote(ctx context.Context, l LowerRange, id *arena.ID) error {
	keys := [1]chunk.Key{l.key}
	var ids [1]arena.ID
	got, err := m.promote(ctx, l.parent, keys[:], ids[:], l.upTo)
	if got == 0 {
		if err == nil {
			err = ErrNotFound
		}
		return err
	}
	*id = ids[0]
	return nil
}
