package disk

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"kvtier/chunk"
	"kvtier/tier"
)

// fillTier stores n keys (numbered from 0) in a fresh tier in dir and
// returns their payloads.
func fillTier(t *testing.T, d *Tier, n int, maxSize int) map[chunk.Key][]byte {
	t.Helper()
	want := map[chunk.Key][]byte{}
	for i := range uint64(n) {
		k := testKey(i)
		want[k] = testPayload(k, testSize(i, maxSize))
		mustPut(t, d, k, want[k])
	}
	return want
}

func TestCorruptPayloadIsDroppedOnGet(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Capacity: 64 << 20, SegmentSize: 1 << 20}
	d := openTier(t, dir, opts)
	k := testKey(1)
	data := testPayload(k, 50000)
	mustPut(t, d, k, data)
	other := testKey(2)
	mustPut(t, d, other, testPayload(other, 7000))
	path, off := location(t, d, k)
	flipByte(t, path, off+blockSize+49999) // the payload's last byte

	dst := make([]byte, len(data))
	if _, err := d.Get(context.Background(), k, dst); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("Get of a damaged payload: %v", err)
	}
	if _, err := d.Get(context.Background(), k, dst); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("second Get of a dropped record: %v", err)
	}
	st := d.Stats()
	if st.Corrupt != 1 || st.Objects != 1 || d.Contains(k) {
		t.Fatalf("after dropping: %+v", st)
	}
	checkGet(t, d, other, testPayload(other, 7000))
	d.Close()
	d = openTier(t, dir, opts)
	defer d.Close()
	if d.Contains(k) {
		t.Fatal("the dropped record came back after a restart")
	}
	checkGet(t, d, other, testPayload(other, 7000))
}

func TestCorruptHeader(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Capacity: 64 << 20, SegmentSize: 8 << 20}
	d := openTier(t, dir, opts)
	want := fillTier(t, d, 20, 30000)

	// While open: the index still points at the record; the read notices.
	hot := testKey(3)
	path, off := location(t, d, hot)
	flipByte(t, path, off+40) // inside the key hash
	if _, err := d.Get(context.Background(), hot, make([]byte, len(want[hot]))); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("Get with a damaged header: %v", err)
	}

	// While closed: the scan must skip the record and find the ones after
	// it. The checkpoint of the clean stop would spare the scan, so it goes.
	cold := testKey(10)
	path, off = location(t, d, cold)
	d.Close()
	flipByte(t, path, off+60) // inside the payload checksum
	if err := os.Remove(filepath.Join(dir, checkpointName)); err != nil {
		t.Fatal(err)
	}
	d = openTier(t, dir, opts)
	for k, v := range want {
		if k == hot || k == cold {
			if d.Contains(k) {
				t.Fatalf("record %v with a damaged header was indexed", k)
			}
			continue
		}
		checkGet(t, d, k, v)
	}

	// With a checkpoint, a header damaged at rest is only seen by the Get
	// that reads it, which must drop the record rather than serve it.
	cold = testKey(11)
	path, off = location(t, d, cold)
	d.Close()
	flipByte(t, path, off+60)
	d = openTier(t, dir, opts)
	defer d.Close()
	if !d.Recovered().Checkpoint {
		t.Fatal("the clean stop's checkpoint was not used")
	}
	if _, err := d.Get(context.Background(), cold, make([]byte, len(want[cold]))); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("Get of a record whose header was damaged at rest: %v", err)
	}
	if d.Contains(cold) {
		t.Fatal("the damaged record stayed indexed after its Get")
	}
}

func TestTornTailIsTruncated(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Capacity: 64 << 20}
	d := openTier(t, dir, opts)
	want := fillTier(t, d, 5, 30000)
	last := testKey(4)
	want[last] = testPayload(last, 30000) // at least two blocks of payload
	d.Remove(last)
	mustPut(t, d, last, want[last])
	path, off := location(t, d, last)
	_, prev := location(t, d, testKey(3))
	intactEnd := prev + recordSize(int64(len(want[testKey(3)]))) // then the hole Remove left
	d.Close()
	if err := os.Truncate(path, off+blockSize+100); err != nil {
		t.Fatal(err)
	}
	d = openTier(t, dir, opts)
	if d.Contains(last) {
		t.Fatal("a record cut short was indexed")
	}
	for k, v := range want {
		if k != last {
			checkGet(t, d, k, v)
		}
	}
	d.Close()
	if st, err := os.Stat(path); err != nil || st.Size() != intactEnd {
		t.Fatalf("segment not truncated after its last intact record: size %d, %v (want %d)", st.Size(), err, intactEnd)
	}
}

func TestGarbageAfterTheLastRecord(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Capacity: 64 << 20}
	d := openTier(t, dir, opts)
	want := fillTier(t, d, 5, 30000)
	d.Close()
	path := segmentFiles(t, dir)[0]
	st, _ := os.Stat(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, 3*blockSize+17)
	for i := range junk[blockSize:] { // a zero block, then noise
		junk[blockSize+i] = byte(i*7 + 1)
	}
	f.Write(junk)
	f.Close()

	d = openTier(t, dir, opts)
	defer d.Close()
	for k, v := range want {
		checkGet(t, d, k, v)
	}
	if got, _ := os.Stat(path); got.Size() != st.Size() {
		t.Fatalf("garbage tail kept: size %d, want %d", got.Size(), st.Size())
	}
}

// TestRandomDamage damages closed segment files at random — flipped bytes,
// zeroed and noisy blocks, truncation — and checks that no Get ever
// returns wrong bytes or an unexpected error, and that the tier keeps
// working.
func TestRandomDamage(t *testing.T) {
	r := rand.New(rand.NewPCG(42, 7))
	for trial := range 12 {
		dir := t.TempDir()
		opts := Options{Capacity: 64 << 20, SegmentSize: 256 << 10}
		if trial%2 == 1 {
			opts.DirectIO = DirectOff
		}
		d := openTier(t, dir, opts)
		want := fillTier(t, d, 40, 40000)
		d.Close()

		files := segmentFiles(t, dir)
		for range 1 + r.IntN(6) {
			damage(t, r, files[r.IntN(len(files))])
		}

		d = openTier(t, dir, opts)
		var intact int
		for k, v := range want {
			if getOutcome(t, d, k, v) == nil {
				intact++
			}
		}
		k := testKey(1000)
		mustPut(t, d, k, testPayload(k, 5000))
		checkGet(t, d, k, testPayload(k, 5000))
		d.Close()
		// A second open sees the repaired files and loses nothing more.
		d = openTier(t, dir, opts)
		again := 0
		for k, v := range want {
			if getOutcome(t, d, k, v) == nil {
				again++
			}
		}
		if again != intact {
			t.Fatalf("trial %d: %d records intact after repair, then %d after reopening", trial, intact, again)
		}
		d.Close()
	}
}

func damage(t *testing.T, r *rand.Rand, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	if st.Size() == 0 {
		return
	}
	off := r.Int64N(st.Size())
	switch r.IntN(4) {
	case 0:
		var b [1]byte
		f.ReadAt(b[:], off)
		b[0] ^= byte(1 + r.IntN(255))
		f.WriteAt(b[:], off)
	case 1:
		f.WriteAt(make([]byte, blockSize), off&^(blockSize-1))
	case 2:
		noise := make([]byte, 1+r.IntN(3*blockSize))
		for i := range noise {
			noise[i] = byte(r.Uint32())
		}
		f.WriteAt(noise, off)
	default:
		f.Truncate(off)
	}
}
