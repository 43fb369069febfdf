package disk

import (
	"context"
	"errors"
	"fmt"

	"github.com/zeebo/xxh3"

	"kvtier/chunk"
	"kvtier/tier"
)

// Range writes: a record written a range at a time while its owner is
// still filling it (per-layer saves, docs/layerwise.md). OpenWrite places
// the record and reserves its extent as a Put does; each range's pieces
// are written straight from the caller's buffer once every byte of them
// is final, and summed as they are written; Commit writes the pieces no
// range completed, then the header block, then syncs, as a Put does. Until
// the header is written the extent holds no valid record, so a crash or an
// Abort leaves nothing a scan or a Get would take: Abort punches the extent
// out (giving its room back), and a restart punches out what lies between
// valid records or cuts it off a segment's tail.

var _ tier.RangeWriter = (*Tier)(nil)

// errAborted is why an aborted range write gives its extent back.
var errAborted = errors.New("disk: range write aborted")

// rangeWrite is one record being written by ranges.
type rangeWrite struct {
	t       *Tier
	r       reservation
	size    int64
	piece   int64                  // piece length: the format's for size
	covered [maxPieces]int64       // bytes of each piece the ranges gave
	written [maxPieces / 64]uint64 // pieces written and summed
	hdr     header                 // the piece sums so far
	err     error                  // a failure: the write can only be aborted
	done    bool                   // committed or aborted
}

// ReservesRoom implements tier.RoomReserver: an open takes extents from
// the tier's capacity, so a save opens its chunks in prefix order.
func (t *Tier) ReservesRoom() {}

var _ tier.RoomReserver = (*Tier)(nil)

// OpenWrite implements tier.RangeWriter. It never waits for other writes
// (see reserveLocked): where room would have to come from a write in
// flight, or ctx ends while evictions are punched out, it returns no
// writer. Until its Commit or Abort begins, the write is open: a Put of
// its key fails with tier.ErrRangeOpen instead of waiting for it, and its
// bytes do not make Puts wait for room.
func (t *Tier) OpenWrite(ctx context.Context, key chunk.Key, size int) (tier.RangeWrite, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	need := recordSize(int64(size))
	if size < 0 || need > t.opts.Capacity {
		return nil, fmt.Errorf("disk: range write %v: %d bytes on disk: %w", key, need, tier.ErrTooLarge)
	}
	if stored, err := t.enter(key); stored || err != nil {
		return nil, err
	}
	if err := t.admit(); err != nil {
		t.calls.Done()
		return nil, fmt.Errorf("disk: range write %v: %w", key, err)
	}
	// Wake the wait for punches when ctx ends (the save ended).
	stop := context.AfterFunc(ctx, func() {
		t.mu.Lock()
		t.space.Broadcast()
		t.mu.Unlock()
	})
	defer stop()
	t.mu.Lock()
	if _, busy := t.idx.get(key); busy { // a Put of key is under way: leave the key to it
		t.mu.Unlock()
		t.calls.Done()
		return nil, nil
	}
	r, err := t.reserveLocked(ctx, key, int64(size), need)
	if err == nil && r.seg != nil {
		t.opened[key] = r.need
		t.openedBytes += r.need
	}
	t.mu.Unlock()
	if err != nil || r.seg == nil {
		t.calls.Done()
		return nil, err
	}
	if r.fresh {
		t.createSegment(r.seg)
	}
	<-r.seg.ready
	w := &rangeWrite{t: t, r: r, size: int64(size), piece: 1 << pieceShift(int64(size))}
	if err := r.seg.openErr; err != nil {
		w.close()
		t.finishPut(r, 0, err)
		t.calls.Done()
		return nil, fmt.Errorf("disk: range write %v in segment %d: %w", key, r.seg.id, err)
	}
	w.hdr = header{seg: r.seg.id, off: r.off, key: key, size: int64(size)}
	return w, nil
}

// close ends w's open state: from here it ends on its own (its commit's
// I/O or its abort's punch), so Puts of its key may wait for it again.
func (w *rangeWrite) close() {
	t := w.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.opened[w.r.key]; ok {
		delete(t.opened, w.r.key)
		t.openedBytes -= w.r.need
	}
}

// pieces is how many pieces the record has.
func (w *rangeWrite) pieces() int { return int((w.size + w.piece - 1) / w.piece) }

func (w *rangeWrite) pieceEnd(i int) int64 { return min(int64(i+1)*w.piece, w.size) }

func (w *rangeWrite) isWritten(i int) bool { return w.written[i/64]&(1<<(i%64)) != 0 }

// WriteRange implements tier.RangeWrite: it counts [from, to) towards the
// pieces it overlaps and writes the pieces it completes.
func (w *rangeWrite) WriteRange(ctx context.Context, src []byte, from, to int) error {
	if err := w.check(src); err != nil {
		return err
	}
	if from < 0 || to > len(src) || from > to {
		return w.fail(fmt.Errorf("disk: range [%d, %d) of a %d-byte record", from, to, w.size))
	}
	if from == to {
		return nil
	}
	first, end := int(int64(from)/w.piece), int((int64(to)+w.piece-1)/w.piece)
	for i := first; i < end; i++ {
		lo, hi := max(int64(i)*w.piece, int64(from)), min(w.pieceEnd(i), int64(to))
		w.covered[i] += hi - lo
	}
	return w.writeDone(ctx, src, first, end, false)
}

// check refuses a writer that failed or ended, or a buffer of the wrong size.
func (w *rangeWrite) check(src []byte) error {
	switch {
	case w.done:
		return fmt.Errorf("disk: range write %v: already ended", w.r.key)
	case w.err != nil:
		return w.err
	case int64(len(src)) != w.size:
		return w.fail(fmt.Errorf("disk: range write %v: buffer of %d bytes for %d", w.r.key, len(src), w.size))
	}
	return nil
}

func (w *rangeWrite) fail(err error) error {
	if w.err == nil {
		w.err = err
	}
	return w.err
}

// writeDone writes the unwritten pieces in [first, end) that every range
// has covered (all of them when all is set), one transfer per run of
// adjacent pieces, summing each run while an I/O goroutine writes it.
func (w *rangeWrite) writeDone(ctx context.Context, src []byte, first, end int, all bool) error {
	ready := func(i int) bool { return !w.isWritten(i) && (all || w.covered[i] >= w.pieceEnd(i)-int64(i)*w.piece) }
	for i := first; i < end; {
		if !ready(i) {
			i++
			continue
		}
		j := i + 1
		for j < end && ready(j) {
			j++
		}
		if err := w.writeRun(ctx, src, i, j); err != nil {
			return w.fail(err)
		}
		i = j
	}
	return nil
}

// writeRun writes pieces [i, j) from src and records their sums.
func (w *rangeWrite) writeRun(ctx context.Context, src []byte, i, j int) error {
	t, seg := w.t, w.r.seg
	lo, hi := int64(i)*w.piece, w.pieceEnd(j-1)
	o := t.getOp()
	defer t.putOp(o)
	o.kind, o.seg, o.off, o.buf = opWrite, seg, w.r.off+lo, src[lo:hi]
	t.sched.submit(o)
	for k := i; k < j; k++ { // while the run is written
		w.hdr.sums[k] = xxh3.Hash(src[int64(k)*w.piece : w.pieceEnd(k)])
	}
	if err := t.sched.wait(ctx, o); err != nil {
		return err
	}
	if o.err != nil {
		return fmt.Errorf("disk: range write %v in segment %d: %w", w.r.key, seg.id, o.err)
	}
	for k := i; k < j; k++ {
		w.written[k/64] |= 1 << (k % 64)
	}
	return nil
}

// Commit implements tier.RangeWrite.
func (w *rangeWrite) Commit(ctx context.Context, src []byte, parentKey chunk.Key, hasParent bool) error {
	if err := w.check(src); err != nil {
		w.Abort()
		return err
	}
	w.close()
	t, seg := w.t, w.r.seg
	err := w.writeDone(ctx, src, 0, w.pieces(), true)
	w.r.up = parent{parentKey, hasParent}
	w.hdr.setParent(w.r.up)
	if err == nil {
		o := t.getOp()
		if o.block == nil {
			o.block = alignedBuf(blockSize) // kept with the pooled op
		}
		err = writeHeader(seg.fd, o.block, &w.hdr)
		t.putOp(o)
	}
	if err == nil && t.opts.Sync == SyncEach {
		err = seg.sync.sync(seg.fd)
	}
	w.done = true
	t.finishPut(w.r, int(w.size), err)
	t.calls.Done()
	if err != nil {
		return fmt.Errorf("disk: range write %v in segment %d: %w", w.r.key, seg.id, err)
	}
	return nil
}

// Abort implements tier.RangeWrite.
func (w *rangeWrite) Abort() {
	if w.done {
		return
	}
	w.done = true
	w.close()
	w.t.finishPut(w.r, 0, errAborted) // punches out whatever reached the disk
	w.t.calls.Done()
}
