package disk

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/tier"
)

// layerRanges returns the K and V byte ranges of layer i of a size-byte
// chunk of layers layers (KV_2LTD: every layer's K, then every layer's V).
func layerRanges(size, layers, i int) [2][2]int {
	span := size / (2 * layers)
	return [2][2]int{{i * span, (i + 1) * span}, {(layers + i) * span, (layers + i + 1) * span}}
}

// writeLayers opens a range write of key and writes layers [0, upto) of src.
func writeLayers(t *testing.T, d *Tier, key chunk.Key, src []byte, layers, upto int) tier.RangeWrite {
	t.Helper()
	w, err := d.OpenWrite(context.Background(), key, len(src))
	if err != nil || w == nil {
		t.Fatalf("OpenWrite(%v): %v, %v", key, w, err)
	}
	for i := range upto {
		for _, r := range layerRanges(len(src), layers, i) {
			if err := w.WriteRange(context.Background(), src, r[0], r[1]); err != nil {
				t.Fatalf("layer %d range %v: %v", i, r, err)
			}
		}
	}
	return w
}

// onDisk reads n payload bytes at from of the record reserved for key,
// straight from its segment file, whether or not the record is committed.
func onDisk(t *testing.T, d *Tier, key chunk.Key, from, n int) []byte {
	t.Helper()
	d.mu.Lock()
	i, ok := d.idx.get(key)
	var s slot
	if ok {
		s = d.idx.slots[i]
	}
	d.mu.Unlock()
	if !ok {
		t.Fatalf("%v has no place in the index", key)
	}
	f, err := os.Open(filepath.Join(d.dir, segmentName(s.seg)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, s.off+blockSize+int64(from)); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return b
}

// TestRangeWriteLayers writes a chunk layer by layer, with layers that do
// not start on piece boundaries: each layer's pieces are on disk before
// the commit once no later layer shares them, nothing is visible before
// the commit, and after it the record reads whole, by range and after a
// reopen with the bytes given.
func TestRangeWriteLayers(t *testing.T) {
	dir := t.TempDir()
	d := openTier(t, dir, Options{Capacity: 64 << 20})
	k := testKey(1)
	const layers = 6
	size := 2 * layers * 50_000 // spans of 50,000 bytes over 4 KiB pieces: most pieces straddle two layers
	src := mmapAligned(t, size)
	copy(src, testPayload(k, size))
	w := writeLayers(t, d, k, src, layers, 3)
	if d.Contains(k) {
		t.Fatal("a record is visible before its commit")
	}
	// Layers 0-2's K spans cover [0, 150000): the whole pieces below
	// 147456 (36 pieces of 4 KiB) are written; the piece straddling layer 3
	// waits for it.
	if got := onDisk(t, d, k, 0, 147456); !bytes.Equal(got, src[:147456]) {
		t.Fatal("layers 0-2 are not on disk before the commit")
	}
	if got := onDisk(t, d, k, 147456, 4096); bytes.Equal(got, src[147456:147456+4096]) {
		t.Fatal("a piece shared with layer 3 was written before layer 3")
	}
	if err := w.Commit(context.Background(), src, chunk.Key{}, false); err != nil {
		t.Fatal(err)
	}
	checkGet(t, d, k, src)
	dst := mmapAligned(t, size)
	rr, err := d.OpenRange(context.Background(), k, dst)
	if err != nil {
		t.Fatal(err)
	}
	for i := layers - 1; i >= 0; i-- {
		for _, r := range layerRanges(size, layers, i) {
			if err := rr.ReadRange(context.Background(), r[0], r[1]); err != nil {
				t.Fatalf("read layer %d: %v", i, err)
			}
			if !bytes.Equal(dst[r[0]:r[1]], src[r[0]:r[1]]) {
				t.Fatalf("layer %d reads back different bytes", i)
			}
		}
	}
	rr.Close()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d = openTier(t, dir, Options{Capacity: 64 << 20, CheckpointRecords: -1})
	defer d.Close()
	checkGet(t, d, k, src)
}

// TestRangeWriteAbortGivesSpaceBack: an aborted write leaves no record,
// now or after a reopen, and its extent is punched out.
func TestRangeWriteAbortGivesSpaceBack(t *testing.T) {
	dir := t.TempDir()
	d := openTier(t, dir, Options{Capacity: 64 << 20, Headroom: -1})
	keep, gone := testKey(1), testKey(2)
	mustPut(t, d, keep, testPayload(keep, 1<<20))
	before := allocatedBytes(t, dir)
	src := mmapAligned(t, 4<<20)
	copy(src, testPayload(gone, len(src)))
	w := writeLayers(t, d, gone, src, 8, 7) // all but the last layer
	if got := allocatedBytes(t, dir); got < before+3<<20 {
		t.Fatalf("%d bytes allocated after writing 7 of 8 layers, %d before", got, before)
	}
	w.Abort()
	w.Abort() // a second Abort does nothing
	// Punching a hole can leave the file system an extent-tree block or two
	// per segment (ext4 does), as the capacity test allows for.
	slack := int64(len(segmentFiles(t, dir))) * 2 * blockSize
	waitFor(t, func() bool { return allocatedBytes(t, dir) <= before+slack && d.Stats().Used == recordSize(1<<20) })
	if d.Contains(gone) {
		t.Fatal("an aborted record is visible")
	}
	if err := w.WriteRange(context.Background(), src, 0, 10); err == nil {
		t.Fatal("a write after Abort was accepted")
	}
	// The key can be stored again, whole.
	mustPut(t, d, gone, src)
	checkGet(t, d, gone, src)
	d.Close()
}

// TestRangeWriteCrashLeavesNoRecord copies the segment files while a range
// write is half done — what a crash would leave on disk: payload without
// a header, between two committed records — and opens the copy: the
// half-written key is not there, the others are, and the half-written
// extent is punched out.
func TestRangeWriteCrashLeavesNoRecord(t *testing.T) {
	dir, crashed := t.TempDir(), t.TempDir()
	d := openTier(t, dir, Options{Capacity: 64 << 20, Headroom: -1, CheckpointRecords: -1})
	a, half, b := testKey(1), testKey(2), testKey(3)
	mustPut(t, d, a, testPayload(a, 1<<20))
	src := mmapAligned(t, 4<<20)
	copy(src, testPayload(half, len(src)))
	w := writeLayers(t, d, half, src, 8, 6)
	mustPut(t, d, b, testPayload(b, 1<<20))
	for _, p := range segmentFiles(t, dir) {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(crashed, filepath.Base(p)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	w.Abort()
	d.Close()
	c := openTier(t, crashed, Options{Capacity: 64 << 20, Headroom: -1})
	defer c.Close()
	if c.Contains(half) {
		t.Fatal("a record without its header was recovered")
	}
	checkGet(t, c, a, testPayload(a, 1<<20))
	checkGet(t, c, b, testPayload(b, 1<<20))
	if got, want := allocatedBytes(t, crashed), 2*recordSize(1<<20); got > want {
		t.Fatalf("%d bytes allocated after recovery, want at most %d: the half-written extent leaked", got, want)
	}
}

// TestRangeWriteDamageIsDetected flips a byte in one layer of a record
// written by ranges: that layer's range read fails as corrupt.
func TestRangeWriteDamageIsDetected(t *testing.T) {
	d := openTier(t, t.TempDir(), Options{Capacity: 64 << 20})
	defer d.Close()
	k := testKey(1)
	const layers, size = 8, 4 << 20
	src := mmapAligned(t, size)
	copy(src, testPayload(k, size))
	w := writeLayers(t, d, k, src, layers, layers)
	if err := w.Commit(context.Background(), src, chunk.Key{}, false); err != nil {
		t.Fatal(err)
	}
	path, off := location(t, d, k)
	r := layerRanges(size, layers, 5)[1]
	flipByte(t, path, off+blockSize+int64(r[0])+100)
	dst := mmapAligned(t, size)
	rr, err := d.OpenRange(context.Background(), k, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer rr.Close()
	if err := rr.ReadRange(context.Background(), 0, layerRanges(size, layers, 0)[0][1]); err != nil {
		t.Fatalf("an undamaged layer: %v", err)
	}
	if err := rr.ReadRange(context.Background(), r[0], r[1]); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("the damaged layer read with %v, want ErrCorrupt", err)
	}
}

// TestRangeWriteOfStoredKey: a key already stored, or being written by a
// Put, gets no writer.
func TestRangeWriteOfStoredKey(t *testing.T) {
	d := openTier(t, t.TempDir(), Options{Capacity: 64 << 20})
	defer d.Close()
	k := testKey(1)
	mustPut(t, d, k, testPayload(k, 8192))
	if w, err := d.OpenWrite(context.Background(), k, 8192); w != nil || err != nil {
		t.Fatalf("OpenWrite of a stored key: %v, %v", w, err)
	}
	k2 := testKey(2)
	w := writeLayers(t, d, k2, mmapAligned(t, 8192), 1, 0)
	if w2, err := d.OpenWrite(context.Background(), k2, 8192); w2 != nil || err != nil {
		t.Fatalf("OpenWrite of a key being written: %v, %v", w2, err)
	}
	w.Abort()
}

// waitFor polls cond for up to ten seconds: punches run on I/O goroutines.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWriteRangeDoesNotAllocate: a range write takes its op from the pool
// and keeps its sums in the writer, so once warm it allocates nothing.
func TestWriteRangeDoesNotAllocate(t *testing.T) {
	d := openTier(t, t.TempDir(), Options{Capacity: 64 << 20})
	defer d.Close()
	const size, span = 4 << 20, 16 << 10
	src := mmapAligned(t, size)
	w, err := d.OpenWrite(context.Background(), testKey(1), size)
	if err != nil || w == nil {
		t.Fatal(w, err)
	}
	ctx, at := context.Background(), 0
	write := func() {
		if err := w.WriteRange(ctx, src, at, at+span); err != nil {
			t.Fatal(err)
		}
		at += span
	}
	write()
	runtime.GC() // as in TestLargeGetDoesNotAllocate
	if a := testing.AllocsPerRun(100, write); a != 0 {
		t.Errorf("%v allocations per WriteRange", a)
	}
	w.Abort()
}

// within runs f and fails the test if it has not returned within a
// minute: a bound on a hang, far above what f needs, not a timing check.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("%s hangs", what)
	}
}

// TestRangeWriteNeverWaits: with a range write open and no room for a
// second record, nothing waits for it — its end is up to a client. A
// second range write gets no writer (it would wait for the first, which
// may be its own save's), a Put of another key fails busy, a Put of the
// open key fails with tier.ErrRangeOpen; once the first commits, the Put
// evicts it and goes through.
func TestRangeWriteNeverWaits(t *testing.T) {
	const size = 1 << 20
	d := openTier(t, t.TempDir(), Options{Capacity: recordSize(size) * 3 / 2, Headroom: -1})
	a, b, c := testKey(1), testKey(2), testKey(3)
	src := mmapAligned(t, size)
	copy(src, testPayload(a, size))
	w := writeLayers(t, d, a, src, 8, 4)
	within(t, "a second OpenWrite", func() {
		if w2, err := d.OpenWrite(context.Background(), b, size); w2 != nil || err != nil {
			t.Errorf("a second range write with no room: %v, %v; want no writer", w2, err)
		}
	})
	within(t, "a Put of another key", func() {
		if err := d.Put(context.Background(), c, testPayload(c, size)); !errors.Is(err, tier.ErrBusy) {
			t.Errorf("Put with the room held by an open range write: %v, want ErrBusy", err)
		}
	})
	within(t, "a Put of the open key", func() {
		if err := d.Put(context.Background(), a, testPayload(a, size)); !errors.Is(err, tier.ErrRangeOpen) {
			t.Errorf("Put of a key being range-written: %v, want ErrRangeOpen", err)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if w2, err := d.OpenWrite(ctx, b, size); w2 != nil || err == nil {
		t.Errorf("OpenWrite with its context ended: %v, %v", w2, err)
	}
	if d.Contains(b) || d.Contains(c) || d.Contains(a) {
		t.Fatal("a record appeared before the commit")
	}
	if err := w.Commit(context.Background(), src, chunk.Key{}, false); err != nil {
		t.Fatal(err)
	}
	checkGet(t, d, a, src)
	mustPut(t, d, c, testPayload(c, size))
	checkGet(t, d, c, testPayload(c, size))
	if d.Contains(a) {
		t.Fatal("two records in the room of one and a half")
	}
	d.Close()
}
