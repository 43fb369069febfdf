package tier

import (
	"context"

	"kvtier/chunk"
)

// RangeReader is implemented by tiers that can read part of an object and
// verify that part on its own: the disk tier, whose records carry a
// checksum per piece. Layerwise retrieval (Manager.AcquireStream) reads a
// chunk layer by layer through it; a tier without it is read whole, before
// the chunk's first layer counts as ready.
type RangeReader interface {
	// OpenRange prepares range reads of key's object into dst, which must
	// be exactly the object's size (Size). A missing key gives
	// ErrNotFound.
	OpenRange(ctx context.Context, key chunk.Key, dst []byte) (RangeRead, error)
}

// RangeChooser is implemented by a RangeReader that may prefer whole
// reads: a remote tier whose store cannot read ranges, or can but was
// measured to be slower at it (S3 unless asked, docs/layerwise.md). Its
// chunks are then read whole, as many at once as a promotion reads.
type RangeChooser interface {
	ReadsRanges() bool
}

// readsRanges returns t as a RangeReader when layerwise retrieval should
// read it a range at a time.
func readsRanges(t Tier) (RangeReader, bool) {
	rr, ok := t.(RangeReader)
	if c, chooses := t.(RangeChooser); ok && chooses && !c.ReadsRanges() {
		return nil, false
	}
	return rr, ok
}

// RangeRead reads one object into its destination a range at a time.
// It is used by one goroutine at a time.
type RangeRead interface {
	// ReadRange makes dst[from:to] hold the object's bytes, verified. It
	// may read and verify bytes around the range too (whole pieces), never
	// outside dst. A range that fails verification gives ErrCorrupt, and
	// the tier drops the object.
	ReadRange(ctx context.Context, from, to int) error
	// Close ends the reads and releases what OpenRange held.
	Close()
}
