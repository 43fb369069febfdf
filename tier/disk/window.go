package disk

import (
	"context"
	"fmt"
	"io"

	"github.com/zeebo/xxh3"

	"kvtier/chunk"
	"kvtier/tier"
)

// Window reads: a range read into a buffer of its own, about the range's
// size, rather than at its offset in a buffer of the record's size. Each
// read covers whole pieces and verifies them; nothing is kept between
// reads but the header (and the tier's header cache), so a piece two
// windows share is read twice.

var _ tier.WindowReader = (*Tier)(nil)

// OpenWindows implements tier.WindowReader.
func (t *Tier) OpenWindows(ctx context.Context, key chunk.Key) (tier.WindowRead, error) {
	return t.openRange(ctx, key, nil)
}

// WindowLen implements tier.WindowRead: the pieces covering [from, to),
// by the header when it is known, else by version 2's geometry, which
// the record's size alone determines (a version 1 record turns out to
// need its whole payload: ReadWindow then asks for more).
func (r *rangeRead) WindowLen(from, to int) int {
	lo, hi := r.window(from, to)
	return int(hi - lo)
}

// window returns the piece-aligned payload span covering [from, to).
func (r *rangeRead) window(from, to int) (lo, hi int64) {
	geo := &r.hdr
	if !r.hdrOK {
		geo = &header{size: r.loc.size}
	}
	p := geo.pieceLen()
	lo = int64(from) / p * p
	hi = min((int64(to)+p-1)/p*p, r.loc.size)
	return lo, max(hi, lo)
}

// ReadWindow implements tier.WindowRead.
func (r *rangeRead) ReadWindow(ctx context.Context, from, to int, buf []byte) ([]byte, error) {
	if r.err != nil {
		return nil, r.err
	}
	if from < 0 || int64(to) > r.loc.size || from > to {
		return nil, fmt.Errorf("disk: range read %v: [%d, %d) of a %d-byte record", r.key, from, to, r.loc.size)
	}
	if from == to {
		return buf[:0], nil
	}
	lo, hi := r.window(from, to)
	if !r.hdrOK && lo > 0 { // the header on its own first, then its geometry
		if err := r.transfer(ctx, 0, 0, nil); err != nil {
			return nil, err
		}
		lo, hi = r.window(from, to)
	}
	if int64(len(buf)) < hi-lo {
		return nil, fmt.Errorf("disk: range read %v: %d-byte buffer for a %d-byte window: %w", r.key, len(buf), hi-lo, io.ErrShortBuffer)
	}
	known := r.hdrOK
	if err := r.transfer(ctx, lo, hi, buf); err != nil {
		return nil, err
	}
	if !known { // the header came with this read: is the window still right?
		if l2, h2 := r.window(from, to); l2 != lo || h2 != hi {
			return nil, fmt.Errorf("disk: range read %v: a version 1 record needs a %d-byte window: %w", r.key, h2-l2, io.ErrShortBuffer)
		}
	}
	p := r.hdr.pieceLen()
	for i := lo / p; i*p < hi; i++ {
		piece := buf[i*p-lo : min((i+1)*p, r.loc.size)-lo]
		if xxh3.Hash(piece) != r.hdr.pieceSum(int(i)) {
			return nil, r.settle(nil, errPayloadSum)
		}
	}
	r.read += hi - lo
	return buf[int64(from)-lo : int64(to)-lo], nil
}
