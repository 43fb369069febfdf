package engine

import (
	"context"
	"fmt"
	"io"
	"testing"
)

// shortFirstWindow is a tier.WindowRead of a record whose header, read
// with the first window, says it needs a window of size bytes: a version
// 1 disk record.
type shortFirstWindow struct {
	size   int
	header bool // the header has been read
}

func (w *shortFirstWindow) WindowLen(from, to int) int {
	if w.header {
		return w.size
	}
	return to - from
}

func (w *shortFirstWindow) ReadWindow(_ context.Context, from, to int, buf []byte) ([]byte, error) {
	if len(buf) < w.WindowLen(from, to) {
		return nil, fmt.Errorf("%d-byte buffer: %w", len(buf), io.ErrShortBuffer)
	}
	if !w.header {
		w.header = true
		return nil, fmt.Errorf("a version 1 record needs a %d-byte window: %w", w.size, io.ErrShortBuffer)
	}
	return buf[from:to], nil
}

func (w *shortFirstWindow) Close() {}

// TestRangeWindowRetryGivesBackShortBuffer: a window read that turns out
// to need a larger buffer (a version 1 record) is read again into one;
// the first, too short, goes back to the pool at once instead of staying
// held with the request until Release.
func TestRangeWindowRetryGivesBackShortBuffer(t *testing.T) {
	e := &Engine{}
	r := &RangeReads{e: e}
	const size = 4 << 20
	w := &shortFirstWindow{size: size}
	data, err := r.window(context.Background(), 0, w, 0, 1<<20)
	if err != nil || len(data) != 1<<20 {
		t.Fatalf("window: %d bytes, %v", len(data), err)
	}
	if got := e.RangeScratchInUse(); got != size || len(r.held) != 1 || r.bytes != size {
		t.Fatalf("%d bytes of scratch in use, %d buffers (%d bytes) held; want only the %d-byte window's", got, len(r.held), r.bytes, size)
	}
	if e.RangeBuffersInUse() != 1 {
		t.Fatalf("%d requests hold scratch, want 1", e.RangeBuffersInUse())
	}
	r.Release()
	if e.RangeScratchInUse() != 0 || e.RangeBuffersInUse() != 0 {
		t.Fatalf("after Release: %d bytes, %d requests", e.RangeScratchInUse(), e.RangeBuffersInUse())
	}
}
