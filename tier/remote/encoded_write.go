package remote

import (
	"context"
	"fmt"

	"github.com/zeebo/xxh3"

	"kvtier/chunk"
	"kvtier/codec"
	"kvtier/kvformat"
	"kvtier/tier"
)

// Range writes of sealed objects (per-layer saves, docs/layerwise.md).
// Over a store that stages objects (Stager: Redis) and reads ranges, a raw
// chunk is sealed as a pieced object (encoded_range.go), whose pieces can
// be written and summed one at a time: each piece goes to the staged
// object once every byte of it is final, and the commit writes the
// pieces no range completed, then publishes the object with its header
// and piece table, built from the sums taken on the way. The published
// object is byte for byte what Put would have stored.
//
// Other codecs compress or quantise the chunk as a whole, and their
// envelope's checksum covers the whole payload: they cannot be written
// piece by piece, and such a tier takes whole chunks after the commit.

var (
	_ tier.RangeWriter       = (*Encoded)(nil)
	_ tier.RangeWriteChooser = (*Encoded)(nil)
)

// maxStagedWrite bounds one staged write, so that the breaker's private
// copy of it stays small even when a commit writes every piece at once.
const maxStagedWrite = 4 << 20

// WritesRanges implements tier.RangeWriteChooser: raw chunks over a store
// that stages (and has not been told not to) and reads ranges, while its
// breaker lets calls through.
func (e *Encoded) WritesRanges() bool {
	if e.stager == nil || e.codec.ID() != codec.IDRaw || !e.canRange() {
		return false
	}
	if c, ok := storeOf(e.inner).(StageChooser); ok && !c.Stages() {
		return false
	}
	if g, ok := e.inner.(*Guarded); ok && g.Open() {
		return false
	}
	return true
}

// OpenWrite implements tier.RangeWriter. It returns no writer, and no
// error, where the chunk is to be written whole after the commit: a tier
// that does not write ranges now, a chunk whose size does not suit its
// scope's format (Put seals those opaque), or a key the store holds.
func (e *Encoded) OpenWrite(ctx context.Context, k chunk.Key, size int) (tier.RangeWrite, error) {
	if !e.WritesRanges() || size <= 0 || size > codec.MaxRawLen {
		return nil, nil
	}
	spec := e.specOf(k.Scope)
	if spec != (kvformat.Spec{}) {
		if _, err := spec.TokensIn(size); err != nil {
			return nil, nil
		}
	}
	if tier.Contains(e.inner, k) {
		return nil, nil
	}
	st, err := e.stager.Stage(ctx, k, codec.PiecedHeaderSize+size)
	if err != nil {
		return nil, fmt.Errorf("%s: range write %v: %w", e.name, k, err)
	}
	return &stagedWrite{e: e, key: k, spec: spec, size: size, piece: 1 << codec.PieceShift(size), st: st}, nil
}

// stagedWrite is one pieced object being written by ranges.
type stagedWrite struct {
	e       *Encoded
	key     chunk.Key
	spec    kvformat.Spec
	size    int
	piece   int
	st      Staged
	covered [codec.MaxPieces]int         // bytes of each piece the ranges gave
	written [codec.MaxPieces / 64]uint64 // pieces written and summed
	sums    [codec.MaxPieces]uint64
	err     error // a failure: the write can only be aborted
	done    bool  // committed or aborted
	found   bool  // the commit found the object stored already
}

// FoundStored reports, after a Commit that returned nil, whether the
// store held the object already, so that the commit dropped the staged
// bytes and published nothing.
func (w *stagedWrite) FoundStored() bool { return w.found }

func (w *stagedWrite) pieces() int { return (w.size + w.piece - 1) / w.piece }

func (w *stagedWrite) pieceEnd(i int) int { return min((i+1)*w.piece, w.size) }

func (w *stagedWrite) isWritten(i int) bool { return w.written[i/64]&(1<<(i%64)) != 0 }

// WriteRange implements tier.RangeWrite: it counts [from, to) towards the
// pieces it overlaps and writes the pieces it completes.
func (w *stagedWrite) WriteRange(ctx context.Context, src []byte, from, to int) error {
	if err := w.check(src); err != nil {
		return err
	}
	if from < 0 || to > len(src) || from > to {
		return w.fail(fmt.Errorf("%s: range [%d, %d) of a %d-byte chunk", w.e.name, from, to, w.size))
	}
	if from == to {
		return nil
	}
	first, end := from/w.piece, (to+w.piece-1)/w.piece
	for i := first; i < end; i++ {
		w.covered[i] += min(w.pieceEnd(i), to) - max(i*w.piece, from)
	}
	return w.writeDone(ctx, src, first, end, false)
}

func (w *stagedWrite) check(src []byte) error {
	switch {
	case w.done:
		return fmt.Errorf("%s: range write %v: already ended", w.e.name, w.key)
	case w.err != nil:
		return w.err
	case len(src) != w.size:
		return w.fail(fmt.Errorf("%s: range write %v: buffer of %d bytes for %d", w.e.name, w.key, len(src), w.size))
	}
	return nil
}

func (w *stagedWrite) fail(err error) error {
	if w.err == nil {
		w.err = err
	}
	return w.err
}

// writeDone writes the unwritten pieces in [first, end) that the ranges
// have covered (all of them when all is set), one staged write per run of
// adjacent pieces of at most maxStagedWrite bytes.
func (w *stagedWrite) writeDone(ctx context.Context, src []byte, first, end int, all bool) error {
	ready := func(i int) bool { return !w.isWritten(i) && (all || w.covered[i] >= w.pieceEnd(i)-i*w.piece) }
	most := max(1, maxStagedWrite/w.piece)
	for i := first; i < end; {
		if !ready(i) {
			i++
			continue
		}
		j := i + 1
		for j < end && j-i < most && ready(j) {
			j++
		}
		if err := w.writeRun(ctx, src, i, j); err != nil {
			return w.fail(err)
		}
		i = j
	}
	return nil
}

// writeRun sums pieces [i, j) of src and writes them to the staged object.
func (w *stagedWrite) writeRun(ctx context.Context, src []byte, i, j int) error {
	for k := i; k < j; k++ {
		w.sums[k] = xxh3.Hash(src[k*w.piece : w.pieceEnd(k)])
	}
	lo, hi := i*w.piece, w.pieceEnd(j-1)
	if err := w.st.WriteAt(ctx, codec.PiecedHeaderSize+lo, src[lo:hi]); err != nil {
		return err
	}
	for k := i; k < j; k++ {
		w.written[k/64] |= 1 << (k % 64)
	}
	return nil
}

// Commit implements tier.RangeWrite: the pieces no range completed, then
// the header, published with the object in one step.
func (w *stagedWrite) Commit(ctx context.Context, src []byte, _ chunk.Key, _ bool) error {
	if err := w.check(src); err != nil {
		w.Abort()
		return err
	}
	err := w.writeDone(ctx, src, 0, w.pieces(), true)
	var head []byte
	if err == nil {
		head, err = codec.AppendPiecedHeader(make([]byte, 0, codec.PiecedHeaderSize), w.spec, w.size, w.sums[:w.pieces()])
	}
	if err == nil {
		err = w.st.Publish(ctx, head)
	}
	if err != nil {
		w.Abort()
		return fmt.Errorf("%s: range write %v: %w", w.e.name, w.key, err)
	}
	if r, ok := w.st.(FoundStoredReporter); ok {
		w.found = r.FoundStored()
	}
	w.done = true
	return nil
}

// Abort implements tier.RangeWrite: it drops the staged object, or leaves
// it to expire when the store does not answer.
func (w *stagedWrite) Abort() {
	if w.done {
		return
	}
	w.done = true
	_ = w.st.Discard(context.Background())
}
