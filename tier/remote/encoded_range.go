package remote

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"kvtier/chunk"
	"kvtier/codec"
	"kvtier/tier"
)

// Range reads of sealed objects (layerwise loads, docs/layerwise.md). Over
// a store that can read ranges (RangeGetter: Redis), raw chunks are sealed
// as pieced objects (codec format version 2), whose piece table lets a
// reader fetch and verify one layer of a chunk without the rest. Objects
// of version 1, other codecs and stores without range reads are read
// whole, at the first range asked for.

var _ tier.RangeReader = (*Encoded)(nil)

// RangePreferrer is implemented by a store that can read ranges but may
// be faster read whole (S3: one request per range costs more than the
// bytes it saves, unless configured otherwise).
type RangePreferrer interface {
	PrefersRanges() bool
}

// RangeCapable is implemented by a store that may turn out not to read
// ranges after all (a kvtier:// daemon older than RETRIEVE_RANGES). Once
// ReadsRanges is false, raw chunks are sealed unpieced for it and sized
// from the store's length, with no range read.
type RangeCapable interface {
	ReadsRanges() bool
}

// canRange reports whether the store reads ranges, now.
func (e *Encoded) canRange() bool {
	if e.ranged == nil {
		return false
	}
	if c, ok := storeOf(e.inner).(RangeCapable); ok {
		return c.ReadsRanges()
	}
	return true
}

// ReadsRanges implements tier.RangeChooser: layerwise loads read ranges
// only from a store that can, and that does not prefer whole reads.
func (e *Encoded) ReadsRanges() bool {
	if !e.canRange() {
		return false
	}
	if p, ok := storeOf(e.inner).(RangePreferrer); ok {
		return p.PrefersRanges()
	}
	return true
}

// storeOf returns the store behind the circuit breaker, if t has one.
func storeOf(t tier.Tier) tier.Tier {
	if g, ok := t.(*Guarded); ok {
		return g.inner
	}
	return t
}

// pieced reports whether Put seals raw chunks as pieced objects.
func (e *Encoded) pieced(c codec.Codec) bool {
	return c.ID() == codec.IDRaw && e.canRange()
}

// rawSize returns the decoded size of k's raw object, stored as n bytes,
// from its header, read with one range read. The store's breaker bounds
// the call and counts its failures (a deadline of our own would be taken
// for the caller's cancellation, which says nothing about the store).
// A store that this very read found not to read ranges (a kvtier://
// daemon older than RETRIEVE_RANGES; its GetRange then reads the object
// whole, and only that failing gets here) is sized from n, as Size sizes
// it from then on. A read that fails otherwise is no size: the store that failed it would fail the Get as
// well, and a size would only promise a chunk that cannot be delivered.
func (e *Encoded) rawSize(k chunk.Key, n int) (int, bool) {
	var head [codec.HeaderSize]byte
	got, err := e.ranged.GetRange(context.Background(), k, 0, head[:])
	if err != nil {
		if !e.canRange() {
			return n - codec.HeaderSize, true
		}
		return 0, false
	}
	if got < codec.HeaderSize {
		return 0, false
	}
	info, err := codec.PeekInfo(head[:])
	if err != nil {
		e.damaged(k, err, Damage{Size: n, Head: head[:]})
		return 0, false
	}
	return info.RawLen, true
}

// OpenRange implements tier.RangeReader. It reads the object's header and
// piece table; a version 1 object, or any object when the store cannot read
// ranges, is read whole by the first ReadRange.
func (e *Encoded) OpenRange(ctx context.Context, k chunk.Key, dst []byte) (tier.RangeRead, error) {
	if e.ranged == nil {
		return &wholeRange{e: e, key: k, dst: dst}, nil
	}
	r := &piecedRange{e: e, key: k, dst: dst}
	head := make([]byte, codec.PiecedHeaderSize)
	n, err := e.ranged.GetRange(ctx, k, 0, head)
	switch {
	case err != nil:
		return nil, err
	case n == 0:
		return nil, fmt.Errorf("%s: %v: %w", e.name, k, tier.ErrNotFound)
	}
	err = codec.PeekPieces(head[:n], &r.p)
	if errors.Is(err, codec.ErrForeign) && r.p.Info.RawLen > 0 {
		return &wholeRange{e: e, key: k, dst: dst}, nil // version 1
	}
	if err == nil && r.p.Info.RawLen != len(dst) {
		err = fmt.Errorf("chunk of %d bytes, buffer of %d: %w", r.p.Info.RawLen, len(dst), io.ErrShortBuffer)
	}
	if err != nil {
		// A short header is the whole object (a range read comes back
		// short only at its end): its length goes into the condition, so
		// that a good object, which begins with the same bytes, is spared.
		size := -1
		if n < len(head) {
			size = n
		}
		e.damaged(k, err, Damage{Size: size, Head: head[:n]})
		return nil, fmt.Errorf("%s: %v: %v: %w", e.name, k, err, tier.ErrCorrupt)
	}
	r.head = head[:n]
	return r, nil
}

// piecedRange reads a pieced object's chunk a range at a time.
type piecedRange struct {
	e    *Encoded
	key  chunk.Key
	dst  []byte
	p    codec.Pieces
	head []byte                       // the header and piece table as OpenRange read them
	have [codec.MaxPieces / 64]uint64 // verified pieces
}

// ReadRange implements tier.RangeRead: one range read of the unverified
// pieces covering [from, to), each checked against the piece table.
func (r *piecedRange) ReadRange(ctx context.Context, from, to int) error {
	if from < 0 || to > len(r.dst) || from > to {
		return fmt.Errorf("%s: range [%d, %d) of a %d-byte chunk", r.e.name, from, to, len(r.dst))
	}
	if from == to {
		return nil
	}
	pl := r.p.PieceLen()
	first, end := from/pl, (to+pl-1)/pl
	for first < end && r.verified(first) {
		first++
	}
	for end > first && r.verified(end-1) {
		end--
	}
	if first == end {
		return nil
	}
	lo, hi := first*pl, min(end*pl, len(r.dst))
	n, err := r.e.ranged.GetRange(ctx, r.key, codec.PiecedHeaderSize+lo, r.dst[lo:hi])
	if err != nil {
		return err
	}
	if n == 0 {
		// Gone since OpenRange (evicted, cleared): a miss, not damage.
		return fmt.Errorf("%s: %v: %w", r.e.name, r.key, tier.ErrNotFound)
	}
	for i := first; i < end; i++ {
		plo, phi := i*pl, min((i+1)*pl, len(r.dst))
		if phi > lo+n || !r.p.Check(i, r.dst[plo:phi]) {
			return r.failed(ctx, i, lo, hi, n)
		}
		r.have[i/64] |= 1 << (i % 64)
	}
	r.e.verified()
	return nil
}

// failed handles piece i of the range read of [lo, hi) (n bytes of it)
// failing its check, or cut short before its end. The object may have been
// replaced since OpenRange (expired, then stored again, perhaps with
// another codec), and the piece table is the old object's: so the header
// is read again first, and a header that changed, or is gone, makes the
// read a miss, not damage. Otherwise the object is damaged, and is removed
// only if the store still holds the header and the bytes that failed and,
// when the read came back short (the object ends there: it is truncated),
// has that length: a good object stored since begins with the same bytes.
func (r *piecedRange) failed(ctx context.Context, i, lo, hi, n int) error {
	head := make([]byte, len(r.head))
	got, err := r.e.ranged.GetRange(ctx, r.key, 0, head)
	if err != nil {
		return err
	}
	if got != len(r.head) || !bytes.Equal(head, r.head) {
		return fmt.Errorf("%s: %v: replaced since its header was read: %w", r.e.name, r.key, tier.ErrNotFound)
	}
	size := -1
	if n < hi-lo {
		size = codec.PiecedHeaderSize + lo + n
	}
	// The piece that failed, as read, not the whole range.
	pl := r.p.PieceLen()
	part := r.dst[i*pl : min((i+1)*pl, lo+n)]
	r.e.damaged(r.key, codec.ErrCorrupt, Damage{Size: size, Head: r.head, Off: codec.PiecedHeaderSize + i*pl, Part: part})
	return fmt.Errorf("%s: %v: piece %d of %d: %w", r.e.name, r.key, i, r.p.Count, tier.ErrCorrupt)
}

func (r *piecedRange) verified(i int) bool { return r.have[i/64]&(1<<(i%64)) != 0 }

// Close implements tier.RangeRead.
func (r *piecedRange) Close() {}

// wholeRange reads the whole object at the first range asked for.
type wholeRange struct {
	e    *Encoded
	key  chunk.Key
	dst  []byte
	done bool
}

func (w *wholeRange) ReadRange(ctx context.Context, from, to int) error {
	if w.done || from == to {
		return nil
	}
	n, err := w.e.Get(ctx, w.key, w.dst)
	if err == nil && n != len(w.dst) {
		err = fmt.Errorf("%s: %v: %d bytes for a %d-byte buffer: %w", w.e.name, w.key, n, len(w.dst), tier.ErrCorrupt)
	}
	w.done = err == nil
	return err
}

func (w *wholeRange) Close() {}
