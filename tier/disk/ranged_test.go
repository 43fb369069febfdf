package disk

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"

	"github.com/zeebo/xxh3"

	"kvtier/chunk"
	"kvtier/tier"
)

// TestRangeReadsVerifyOnlyTheirPieces reads ranges of a multi-piece record
// in a scattered order and checks that each fills exactly the pieces it
// covers with the stored bytes and leaves the rest of dst alone.
func TestRangeReadsVerifyOnlyTheirPieces(t *testing.T) {
	d := openTier(t, t.TempDir(), Options{Capacity: 64 << 20})
	defer d.Close()
	k := testKey(1)
	size := 2<<20 + 12345 // pieces of 16 KiB, the last one short
	want := testPayload(k, size)
	mustPut(t, d, k, want)
	p := int((&header{size: int64(size)}).pieceLen())
	dst := mmapAligned(t, size)
	const fill = 0xA5
	for i := range dst {
		dst[i] = fill
	}
	rr, err := d.OpenRange(context.Background(), k, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer rr.Close()
	covered := make([]bool, size)
	for _, r := range [][2]int{{5 * p, 6 * p}, {p + 1, p + 2}, {size - 3, size}, {0, 10}, {3*p - 1, 4*p + 1}, {7 * p, 7 * p}} {
		if err := rr.ReadRange(context.Background(), r[0], r[1]); err != nil {
			t.Fatalf("range %v: %v", r, err)
		}
		if r[0] == r[1] {
			continue
		}
		for i := r[0] / p * p; i < min((r[1]+p-1)/p*p, size); i++ {
			covered[i] = true
		}
		for i := range size {
			if covered[i] && dst[i] != want[i] || !covered[i] && dst[i] != fill {
				t.Fatalf("after range %v: byte %d is %#x (covered %v, stored %#x)", r, i, dst[i], covered[i], want[i])
			}
		}
	}
	if err := rr.ReadRange(context.Background(), 0, size+1); err == nil {
		t.Fatal("a range past the record was accepted")
	}
}

// TestRangeReadFindsCorruptPiece damages one piece: ranges elsewhere still
// read, the damaged one is ErrCorrupt, and the record is dropped.
func TestRangeReadFindsCorruptPiece(t *testing.T) {
	d := openTier(t, t.TempDir(), Options{Capacity: 64 << 20})
	defer d.Close()
	k := testKey(2)
	size := 1 << 20 // 256 pieces of 4 KiB
	want := testPayload(k, size)
	mustPut(t, d, k, want)
	path, off := location(t, d, k)
	flipByte(t, path, off+blockSize+int64(100*4096+7)) // piece 100

	dst := mmapAligned(t, size)
	rr, err := d.OpenRange(context.Background(), k, dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := rr.ReadRange(context.Background(), 0, 100*4096); err != nil {
		t.Fatalf("clean pieces: %v", err)
	}
	if !bytes.Equal(dst[:100*4096], want[:100*4096]) {
		t.Fatal("clean pieces hold wrong bytes")
	}
	if err := rr.ReadRange(context.Background(), 100*4096, 101*4096); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("damaged piece: %v", err)
	}
	if err := rr.ReadRange(context.Background(), 200*4096, 201*4096); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("a read after the damage: %v", err)
	}
	rr.Close()
	if d.Contains(k) || d.Stats().Corrupt != 1 {
		t.Fatalf("damaged record kept: contains %v, %+v", d.Contains(k), d.Stats())
	}
	if _, err := d.OpenRange(context.Background(), k, dst); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("open after the drop: %v", err)
	}
}

// rewriteAsV1 replaces key's header block with the one the version 1
// encoder wrote: one checksum of the whole payload.
func rewriteAsV1(t *testing.T, d *Tier, key chunk.Key, payload []byte) {
	t.Helper()
	path, off := location(t, d, key)
	block := make([]byte, blockSize)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(block, off); err != nil {
		t.Fatal(err)
	}
	h, err := decodeHeader(block)
	if err != nil {
		t.Fatal(err)
	}
	h.version, h.sum, h.sums = version1, xxh3.Hash(payload), [maxPieces]uint64{}
	h.encode(block)
	if _, err := f.WriteAt(block, off); err != nil {
		t.Fatal(err)
	}
}

// TestVersion1RecordsStillRead writes version 1 records (the old header)
// and reads them whole and by range, before and after a restart that scans
// the segments; a damaged version 1 record is still caught.
func TestVersion1RecordsStillRead(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Capacity: 64 << 20, CheckpointRecords: -1, CheckpointInterval: -1}
	d := openTier(t, dir, opts)
	want := map[chunk.Key][]byte{}
	for i := range uint64(4) {
		k := testKey(i)
		want[k] = testPayload(k, 300000+int(i)*4099)
		mustPut(t, d, k, want[k])
		rewriteAsV1(t, d, k, want[k])
	}
	bad := testKey(3)
	path, off := location(t, d, bad)
	flipByte(t, path, off+blockSize+5)
	for round := range 2 {
		for i := range uint64(3) {
			k := testKey(i)
			checkGet(t, d, k, want[k])
			dst := mmapAligned(t, len(want[k]))
			rr, err := d.OpenRange(context.Background(), k, dst)
			if err != nil {
				t.Fatalf("round %d: open %v: %v", round, k, err)
			}
			if err := rr.ReadRange(context.Background(), 5000, 6000); err != nil {
				t.Fatalf("round %d: range of a version 1 record: %v", round, err)
			}
			rr.Close()
			if !bytes.Equal(dst, want[k]) { // one piece: the whole payload came
				t.Fatalf("round %d: version 1 range read gave wrong bytes", round)
			}
		}
		if round == 0 {
			if _, err := d.Get(context.Background(), bad, make([]byte, len(want[bad]))); !errors.Is(err, tier.ErrCorrupt) {
				t.Fatalf("damaged version 1 record: %v", err)
			}
			d.Close()
			d = openTier(t, dir, opts)
		}
	}
	d.Close()
}

// TestRangeReadChecksTheHeader damages the header block of two records:
// the first range read of each fails, whether the header comes with the
// range (from the payload's start) or on its own before it.
func TestRangeReadChecksTheHeader(t *testing.T) {
	d := openTier(t, t.TempDir(), Options{Capacity: 64 << 20})
	defer d.Close()
	for i, from := range []int{0, 8192} {
		k := testKey(uint64(10 + i))
		mustPut(t, d, k, testPayload(k, 100000))
		path, off := location(t, d, k)
		flipByte(t, path, off+40) // inside the key hash
		rr, err := d.OpenRange(context.Background(), k, mmapAligned(t, 100000))
		if err != nil {
			t.Fatal(err)
		}
		if err := rr.ReadRange(context.Background(), from, from+100); !errors.Is(err, tier.ErrCorrupt) {
			t.Fatalf("range from %d with a damaged header: %v", from, err)
		}
		rr.Close()
		if d.Contains(k) {
			t.Fatalf("record %d kept", i)
		}
	}
}
