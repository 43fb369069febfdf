package disk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/zeebo/xxh3"

	"kvtier/chunk"
	"kvtier/tier"
)

// Range reads: a record's payload read a range at a time, each range
// widened to the pieces it covers and verified against their checksums
// (FORMAT). A version 1 record is one piece: its first range reads it all.

var _ tier.RangeReader = (*Tier)(nil)

// rangeRead is one record open for range reads. It keeps the header (read
// once, with the first range) and which pieces are already verified, so a
// piece two ranges share is read once.
type rangeRead struct {
	t     *Tier
	key   chunk.Key
	slot  int32 // the record's index slot, for the header cache
	loc   slot
	seg   *segment
	dst   []byte
	hdr   header
	hdrOK bool                   // hdr was read and matches the index
	have  [maxPieces / 64]uint64 // verified pieces
	read  int64                  // payload bytes read
	err   error                  // a failure that ends the record's reads
	done  bool
}

// OpenRange implements tier.RangeReader. It reads nothing yet: the header
// block comes from the header cache, with the first range that starts at
// the payload's start (a chunk's layer 0), or on its own before the first
// range that does not.
func (t *Tier) OpenRange(ctx context.Context, key chunk.Key, dst []byte) (tier.RangeRead, error) {
	if dst == nil {
		dst = []byte{} // nil is OpenWindows' mark
	}
	return t.openRange(ctx, key, dst)
}

// openRange opens key's record for range reads into dst, or for window
// reads (no destination of the record's size) when dst is nil.
func (t *Tier) openRange(ctx context.Context, key chunk.Key, dst []byte) (*rangeRead, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t.waitQueueRoom()
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, tier.ErrClosed
	}
	i, ok := t.idx.liveSlot(key)
	if !ok {
		t.st.Misses++
		t.mu.Unlock()
		return nil, tier.ErrNotFound
	}
	loc := t.idx.slots[i]
	if dst != nil && int64(len(dst)) != loc.size {
		t.mu.Unlock()
		return nil, fmt.Errorf("disk: range read %v: buffer of %d bytes for %d: %w", key, len(dst), loc.size, io.ErrShortBuffer)
	}
	seg := t.segs[loc.seg]
	seg.refs++
	t.idx.touch(i)
	t.calls.Add(1)
	r := &rangeRead{t: t, key: key, slot: i, loc: loc, seg: seg, dst: dst}
	r.hdrOK = t.idx.hdrs.get(i, loc, &r.hdr)
	t.mu.Unlock()
	return r, nil
}

// transfer reads payload bytes [lo, hi) into buf (hi - lo bytes), with
// the header block along when lo is 0, and checks the header the first
// time it comes, keeping it in the tier's header cache once checked.
func (r *rangeRead) transfer(ctx context.Context, lo, hi int64, buf []byte) error {
	o := r.t.getOp()
	o.kind, o.seg, o.off, o.from, o.buf = opRead, r.seg, r.loc.off, lo, buf[:hi-lo]
	err := r.t.sched.do(ctx, o)
	if err == nil {
		err = o.err
	}
	var bad error
	if err == nil && lo == 0 && !r.hdrOK {
		r.hdr, bad = o.hdr, o.hdrErr
		if bad == nil && (r.hdr.key != r.key || r.hdr.seg != r.loc.seg || r.hdr.off != r.loc.off || r.hdr.size != r.loc.size) {
			bad = errMisplaced
		}
		r.hdrOK = bad == nil
		if r.hdrOK {
			r.cacheHeader()
		}
	}
	r.t.putOp(o)
	if err != nil && ctx.Err() != nil {
		return err // the caller's own cancellation: the record is not at fault
	}
	return r.settle(err, bad)
}

// ReadRange implements tier.RangeRead: it reads the unverified pieces
// covering dst[from:to] in one transfer and verifies each of them.
func (r *rangeRead) ReadRange(ctx context.Context, from, to int) error {
	if r.err != nil {
		return r.err
	}
	if r.dst == nil {
		return fmt.Errorf("disk: range read %v: opened for window reads", r.key)
	}
	if from < 0 || to > len(r.dst) || from > to {
		return fmt.Errorf("disk: range [%d, %d) of a %d-byte record", from, to, len(r.dst))
	}
	if from == to {
		return nil
	}
	// Until the header is read, pieces are taken to be version 2's, which
	// the record's size alone determines; a version 1 header then asks for
	// the whole payload.
	geo := &r.hdr
	if !r.hdrOK {
		geo = &header{size: r.loc.size}
	}
	first, end := r.cover(geo, from, to)
	if first == end {
		return nil
	}
	p := geo.pieceLen()
	lo, hi := int64(first)*p, min(int64(end)*p, r.loc.size)
	if !r.hdrOK && lo > 0 { // the header on its own first, then its geometry
		if err := r.transfer(ctx, 0, 0, nil); err != nil {
			return err
		}
		if first, end = r.cover(&r.hdr, from, to); first == end {
			return nil
		}
		p = r.hdr.pieceLen()
		lo, hi = int64(first)*p, min(int64(end)*p, r.loc.size)
	}
	if err := r.transfer(ctx, lo, hi, r.dst[lo:hi]); err != nil {
		return err
	}
	if p != r.hdr.pieceLen() { // version 1: one piece, the whole payload
		first, end = r.cover(&r.hdr, from, to)
		p, lo, hi = r.hdr.pieceLen(), 0, r.loc.size
		if err := r.transfer(ctx, lo, hi, r.dst[lo:hi]); err != nil {
			return err
		}
	}
	for i := first; i < end; i++ {
		piece := r.dst[int64(i)*p : min(int64(i+1)*p, r.loc.size)]
		if xxh3.Hash(piece) != r.hdr.pieceSum(i) {
			return r.settle(nil, errPayloadSum)
		}
		r.have[i/64] |= 1 << (i % 64)
	}
	r.read += hi - lo
	return nil
}

// cover returns the run of pieces of geometry h covering [from, to),
// without the verified ones at either end.
func (r *rangeRead) cover(h *header, from, to int) (first, end int) {
	p := h.pieceLen()
	first, end = int(int64(from)/p), int((int64(to)+p-1)/p)
	for first < end && r.verified(first) {
		first++
	}
	for end > first && r.verified(end-1) {
		end--
	}
	return first, end
}

func (r *rangeRead) verified(i int) bool { return r.have[i/64]&(1<<(i%64)) != 0 }

// settle turns an I/O error or a failed check into the read's error, as
// Get does: a file cut short or a bad checksum drops the record (unless it
// left the index meanwhile: then it is simply gone).
func (r *rangeRead) settle(ioErr, bad error) error {
	if errors.Is(ioErr, io.ErrUnexpectedEOF) {
		bad, ioErr = ioErr, nil
	}
	switch {
	case ioErr != nil:
		r.err = fmt.Errorf("disk: range read %v from segment %d: %w", r.key, r.seg.id, ioErr)
	case bad != nil:
		r.err = r.t.rangeCorrupt(r.key, r.loc, bad)
	}
	return r.err
}

// rangeCorrupt drops a record a range read found damaged.
func (t *Tier) rangeCorrupt(key chunk.Key, loc slot, bad error) error {
	t.mu.Lock()
	i, ok := t.idx.liveSlot(key)
	if !ok || t.idx.slots[i].seg != loc.seg || t.idx.slots[i].off != loc.off {
		t.mu.Unlock()
		return fmt.Errorf("disk: range read %v: %w", key, tier.ErrNotFound)
	}
	t.st.Corrupt++
	t.dropLocked(i)
	t.mu.Unlock()
	t.corrupt.Log(t.log, slog.LevelWarn, "dropped corrupt record", "key", key, "segment", loc.seg, "offset", loc.off, "err", bad)
	return fmt.Errorf("disk: range read %v at segment %d offset %d: %w: %w", key, loc.seg, loc.off, bad, tier.ErrCorrupt)
}

// Close implements tier.RangeRead.
func (r *rangeRead) Close() {
	if r.done {
		return
	}
	r.done = true
	t := r.t
	t.mu.Lock()
	r.seg.refs--
	t.retireIfEmptyLocked(r.seg)
	if r.err == nil {
		t.st.Hits++
		t.st.BytesRead += uint64(r.read)
	}
	t.mu.Unlock()
	t.calls.Done()
}
