package disk

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"kvtier/chunk"
	"kvtier/tier"
)

// readWindow opens key for window reads and reads [from, to) into a
// buffer of exactly WindowLen bytes.
func windowOf(t *testing.T, d *Tier, k chunk.Key, from, to int) ([]byte, bool, error) {
	t.Helper()
	w, err := d.OpenWindows(context.Background(), k)
	if err != nil {
		return nil, false, err
	}
	defer w.Close()
	cached := w.(*rangeRead).hdrOK
	got, err := w.ReadWindow(context.Background(), from, to, make([]byte, w.WindowLen(from, to)))
	return bytes.Clone(got), cached, err
}

// TestWindowReadsBytesExact reads scattered ranges of a multi-piece record
// into buffers of their own size, each checked against the stored bytes;
// a buffer one byte short is refused and leaves the record alone.
func TestWindowReadsBytesExact(t *testing.T) {
	d := openTier(t, t.TempDir(), Options{Capacity: 64 << 20})
	defer d.Close()
	k := testKey(1)
	size := 2<<20 + 12345 // pieces of 16 KiB, the last one short
	want := testPayload(k, size)
	mustPut(t, d, k, want)
	p := int((&header{size: int64(size)}).pieceLen())
	for _, r := range [][2]int{{5 * p, 6 * p}, {p + 1, p + 2}, {size - 3, size}, {0, 10}, {3*p - 1, 4*p + 1}, {7 * p, 7 * p}, {0, size}} {
		got, _, err := windowOf(t, d, k, r[0], r[1])
		if err != nil || !bytes.Equal(got, want[r[0]:r[1]]) {
			t.Fatalf("window %v: %v", r, err)
		}
	}
	w, err := d.OpenWindows(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	from, to := 3*p-1, 4*p+1
	if n := w.WindowLen(from, to); n != 3*p {
		t.Fatalf("window of [%d, %d): %d bytes, want the 3 pieces it touches", from, to, n)
	}
	if _, err := w.ReadWindow(context.Background(), from, to, make([]byte, 3*p-1)); !errors.Is(err, io.ErrShortBuffer) {
		t.Fatalf("short buffer: %v", err)
	}
	if _, err := w.ReadWindow(context.Background(), 0, size+1, make([]byte, size+p)); err == nil {
		t.Fatal("a window past the record was accepted")
	}
	w.Close()
	if !d.Contains(k) {
		t.Fatal("a refused window dropped the record")
	}
}

// TestHeaderCacheNeverStale: a window read past the payload's start reads
// the header on its own and caches it, and the next open of the record
// starts with it. A record removed and written again under the same key
// (in the freed index slot, with other bytes and another size) opens
// without a cached header and reads its own bytes; so does one the tier
// dropped as damaged and that was written again.
func TestHeaderCacheNeverStale(t *testing.T) {
	d := openTier(t, t.TempDir(), Options{Capacity: 64 << 20})
	defer d.Close()
	k := testKey(7)
	size := 1 << 20
	old := testPayload(k, size)
	mustPut(t, d, k, old)
	if _, cached, err := windowOf(t, d, k, size/2, size/2+100); cached || err != nil {
		t.Fatalf("first window: cached %v, %v", cached, err)
	}
	got, cached, err := windowOf(t, d, k, size/4, size/4+100)
	if !cached || err != nil || !bytes.Equal(got, old[size/4:size/4+100]) {
		t.Fatalf("second window: cached %v, %v", cached, err)
	}
	for round, newSize := range []int{size, size + 4096*3 + 7} {
		d.Remove(k)
		fresh := bytes.Clone(testPayload(testKey(uint64(100+round)), newSize))
		mustPut(t, d, k, fresh)
		got, cached, err := windowOf(t, d, k, size/2, size/2+100)
		if cached {
			t.Fatalf("round %d: the rewritten record opened with a cached header", round)
		}
		if err != nil || !bytes.Equal(got, fresh[size/2:size/2+100]) {
			t.Fatalf("round %d: rewritten record: %v (old bytes: %v)", round, err, bytes.Equal(got, old[size/2:size/2+100]))
		}
		if got, cached, err = windowOf(t, d, k, 4096, 4196); !cached || err != nil || !bytes.Equal(got, fresh[4096:4196]) {
			t.Fatalf("round %d: second window of the rewritten record: cached %v, %v", round, cached, err)
		}
	}
	// Damaged: the window over the bad piece fails and the record is
	// dropped, its cached header with it.
	path, off := location(t, d, k)
	flipByte(t, path, off+blockSize+int64(size/2))
	if _, _, err := windowOf(t, d, k, size/2, size/2+100); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("damaged piece: %v", err)
	}
	fresh := testPayload(testKey(200), size)
	mustPut(t, d, k, fresh)
	got, cached, err = windowOf(t, d, k, size/2, size/2+100)
	if cached || err != nil || !bytes.Equal(got, fresh[size/2:size/2+100]) {
		t.Fatalf("written again after the drop: cached %v, %v", cached, err)
	}
}

// TestWindowReadsVersion1: a version 1 record is one piece: a window of
// part of it is refused as too short (the record kept), and a buffer of
// its whole payload reads the range.
func TestWindowReadsVersion1(t *testing.T) {
	d := openTier(t, t.TempDir(), Options{Capacity: 64 << 20})
	defer d.Close()
	for i, from := range []int{0, 50000} { // the header with the window, or on its own
		k := testKey(uint64(3 + i))
		want := testPayload(k, 300000)
		mustPut(t, d, k, want)
		rewriteAsV1(t, d, k, want)
		w, err := d.OpenWindows(context.Background(), k)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.ReadWindow(context.Background(), from, from+100, make([]byte, w.WindowLen(from, from+100))); !errors.Is(err, io.ErrShortBuffer) {
			t.Fatalf("from %d: a part of a version 1 record: %v", from, err)
		}
		if n := w.WindowLen(from, from+100); n != len(want) {
			t.Fatalf("from %d: window of %d bytes once the header is known, want %d", from, n, len(want))
		}
		got, err := w.ReadWindow(context.Background(), from, from+100, make([]byte, len(want)))
		if err != nil || !bytes.Equal(got, want[from:from+100]) {
			t.Fatalf("from %d: %v", from, err)
		}
		w.Close()
	}
}
