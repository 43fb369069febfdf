package kvtier

import (
	"context"
	"errors"
	"fmt"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/tier"
	"kvtier/tier/remote"
	"kvtier/wire"
)

// Range reads (layerwise loads, docs/layerwise.md): each GetRange is one
// RETRIEVE_RANGES of the sealed object's bytes, checked against the
// XXH3-64 the remote daemon sends for the range; the envelope's piece
// table (remote.Encoded, which seals raw chunks as pieced objects over a
// RangeGetter) then verifies the pieces. The remote daemon sends a range
// of a chunk in its RAM by reference and reads one on its disk from the
// disk tier, without promoting it first.
//
// A remote daemon built before RETRIEVE_RANGES existed cannot say so in
// HELLO (neither side's HELLO has a field an older peer would accept), so
// it is found out by asking: Open sends one RETRIEVE_RANGES (a byte of
// the zero key), and every range read watches for the same answer. Such
// a daemon either answers UNKNOWN_OP or, older still, refuses the frame's
// header (a BAD_REQUEST on op PING) and closes the connection
// (client.IsUnknownOp). From then on the tier reads no ranges: the
// envelope stops sealing pieced objects for it and sizes raw objects from
// SIZES alone (remote.RangeCapable), and a range still asked for is read
// whole.

var (
	_ remote.RangeGetter    = (*Tier)(nil)
	_ remote.RangePreferrer = (*Tier)(nil)
	_ remote.RangeCapable   = (*Tier)(nil)
)

// PrefersRanges implements remote.RangePreferrer: ranges, unless the
// remote daemon turned out to predate RETRIEVE_RANGES, whose chunks are
// then read whole.
func (t *Tier) PrefersRanges() bool { return !t.noRanges.Load() }

// ReadsRanges implements remote.RangeCapable: false once the remote
// daemon turned out to predate RETRIEVE_RANGES, until the tier is opened
// again.
func (t *Tier) ReadsRanges() bool { return !t.noRanges.Load() }

// probeRanges asks c's daemon for one byte of the zero key with
// RETRIEVE_RANGES: any answer naming the operation (a miss, as a rule)
// shows that it knows it. A daemon that does not may have closed c.
func (t *Tier) probeRanges(ctx context.Context, c *client.Client) error {
	keys := [1]chunk.Key{}
	rng := [1]wire.ByteRange{{Key: 0, From: 0, To: 1}}
	var b [1]byte
	bufs := [1][]byte{b[:]}
	_, _, err := c.RetrieveRangesTo(ctx, client.Raw(keys[:]), rng[:], bufs[:])
	if client.IsUnknownOp(err) {
		t.noRanges.Store(true)
		return nil
	}
	var se *client.StatusError
	if errors.As(err, &se) {
		return nil // refused for another reason, but known
	}
	return err
}

// GetRange implements remote.RangeGetter: the object's bytes from off,
// up to len(dst), and how many it has there (0 for a missing object).
func (t *Tier) GetRange(ctx context.Context, key chunk.Key, off int, dst []byte) (int, error) {
	if len(dst) == 0 {
		return 0, nil
	}
	ctx, cancel := remote.BoundCall(ctx, t.cfg.Timeout, t.cfg.Bandwidth, len(dst))
	defer cancel()
	if t.noRanges.Load() {
		return t.getRangeWhole(ctx, key, off, dst)
	}
	n, err := t.getRange(ctx, key, off, dst)
	switch {
	case client.IsUnknownOp(err):
		t.noRanges.Store(true)
		return t.getRangeWhole(ctx, key, off, dst)
	case client.IsStatus(err, wire.StatusBadRequest):
		// A range past the object's end (a header read of a small
		// object): ask its size and read what it has.
		size, ok, serr := t.SizeErr(key)
		if serr != nil || !ok || off >= size {
			return 0, serr
		}
		if off+len(dst) <= size {
			return 0, err // it was not the end: the request itself was refused
		}
		return t.getRange(ctx, key, off, dst[:size-off])
	}
	return n, err
}

// getRange reads [off, off+len(dst)) of key's object with one
// RETRIEVE_RANGES.
func (t *Tier) getRange(ctx context.Context, key chunk.Key, off int, dst []byte) (int, error) {
	keys := [1]chunk.Key{key}
	rng := [1]wire.ByteRange{{Key: 0, From: uint32(off), To: uint32(off + len(dst))}}
	bufs := [1][]byte{dst}
	read := 0
	err := t.call(ctx, func(c *client.Client) error {
		var err error
		_, read, err = c.RetrieveRangesTo(ctx, client.Raw(keys[:]), rng[:], bufs[:])
		return err
	})
	if errors.Is(err, client.ErrChecksum) { // damaged on the way
		return 0, fmt.Errorf("kvtier tier %s: range of %v: %w: %w", t.cfg.Addr, key, tier.ErrCorrupt, err)
	}
	if err != nil {
		return 0, fmt.Errorf("kvtier tier %s: range of %v: %w", t.cfg.Addr, key, err)
	}
	if read == 0 {
		t.misses.Add(1)
		return 0, nil
	}
	t.bytesRead.Add(uint64(len(dst)))
	return len(dst), nil
}

// getRangeWhole serves a range from a whole RETRIEVE, for a remote
// daemon without RETRIEVE_RANGES.
func (t *Tier) getRangeWhole(ctx context.Context, key chunk.Key, off int, dst []byte) (int, error) {
	size, ok, err := t.SizeErr(key)
	if err != nil || !ok || off >= size {
		return 0, err
	}
	obj := make([]byte, size)
	n, err := t.Get(ctx, key, obj)
	if err != nil {
		return 0, err
	}
	return copy(dst, obj[off:n]), nil
}
