package tier

import (
	"context"

	"kvtier/chunk"
)

// WindowReader is a RangeReader whose ranges can also be read into
// buffers of their own, each about the size of its range, instead of one
// buffer the size of the whole object: a daemon serving RETRIEVE_RANGES
// of several disk-only chunks then needs scratch memory for the ranges
// asked, not for the chunks (engine.RangeReads).
type WindowReader interface {
	// OpenWindows prepares window reads of key's object. A missing key
	// gives ErrNotFound.
	OpenWindows(ctx context.Context, key chunk.Key) (WindowRead, error)
}

// WindowRead reads ranges of one object, each into a buffer of its own.
// It is used by one goroutine at a time.
type WindowRead interface {
	// WindowLen returns how long a buffer ReadWindow needs for bytes
	// [from, to): the range widened to what the tier reads and verifies
	// together (whole pieces).
	WindowLen(from, to int) int
	// ReadWindow reads the object's bytes [from, to) into buf, verified,
	// and returns them (a slice of buf). A buf shorter than WindowLen
	// gives an error wrapping io.ErrShortBuffer, which says nothing of
	// the object; a range that fails verification gives ErrCorrupt, and
	// the tier drops the object.
	ReadWindow(ctx context.Context, from, to int, buf []byte) ([]byte, error)
	// Close ends the reads.
	Close()
}
