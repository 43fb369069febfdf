package disk

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"kvtier/chunk"
	"kvtier/tier"
)

// testKey returns a distinct key for every n.
func testKey(n uint64) chunk.Key {
	k := chunk.Key{Scope: 0x5eed0000_0000_0000 | n>>40}
	binary.LittleEndian.PutUint64(k.Hash[:], n)
	binary.LittleEndian.PutUint64(k.Hash[8:], n*0x9e3779b97f4a7c15)
	return k
}

// testSize returns a payload size for key number n, up to max bytes, with
// exact block multiples and empty payloads among them.
func testSize(n uint64, max int) int {
	r := rand.New(rand.NewPCG(n, 1))
	switch r.IntN(8) {
	case 0:
		return 0
	case 1:
		return (1 + r.IntN(max/blockSize)) * blockSize
	default:
		return 1 + r.IntN(max)
	}
}

// testPayload returns the bytes stored under key in these tests: derived from
// the key alone, so any process can check them.
func testPayload(key chunk.Key, size int) []byte {
	b := make([]byte, size)
	r := rand.New(rand.NewPCG(key.Scope, binary.LittleEndian.Uint64(key.Hash[:])))
	for i := 0; i < size; i += 8 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], r.Uint64())
		copy(b[i:], w[:])
	}
	return b
}

func openTier(t testing.TB, dir string, opts Options) *Tier {
	t.Helper()
	d, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	return d
}

func mustPut(t testing.TB, d *Tier, key chunk.Key, data []byte) {
	t.Helper()
	if err := d.Put(context.Background(), key, data); err != nil {
		t.Fatalf("Put(%v, %d bytes): %v", key, len(data), err)
	}
}

// checkGet asserts that key reads back as want.
func checkGet(t testing.TB, d *Tier, key chunk.Key, want []byte) {
	t.Helper()
	dst := make([]byte, len(want)+blockSize)
	n, err := d.Get(context.Background(), key, dst)
	if err != nil {
		t.Fatalf("Get(%v): %v", key, err)
	}
	if n != len(want) || !bytes.Equal(dst[:n], want) {
		t.Fatalf("Get(%v) = %d bytes, differing from the %d stored", key, n, len(want))
	}
}

// getOutcome reads key and classifies the result, failing the test if the
// bytes are wrong or the error is neither not-found nor corrupt. It fails
// with t.Errorf, not t.Fatalf, so that goroutines may call it.
func getOutcome(t testing.TB, d *Tier, key chunk.Key, want []byte) error {
	t.Helper()
	dst := make([]byte, len(want)+blockSize)
	n, err := d.Get(context.Background(), key, dst)
	switch {
	case err == nil:
		if n != len(want) || !bytes.Equal(dst[:n], want) {
			t.Errorf("Get(%v) returned %d wrong bytes", key, n)
		}
	case errors.Is(err, tier.ErrNotFound), errors.Is(err, tier.ErrCorrupt):
	default:
		t.Errorf("Get(%v): unexpected error %v", key, err)
	}
	return err
}

// segmentFiles lists the segment files in dir.
func segmentFiles(t testing.TB, dir string) []string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil {
		t.Fatal(err)
	}
	return paths
}

// allocatedBytes sums the file system blocks the segment files occupy. It
// fails with t.Error, so that goroutines may call it.
func allocatedBytes(t testing.TB, dir string) int64 {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil {
		t.Error(err)
	}
	var total int64
	for _, p := range paths {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // retired meanwhile
			}
			t.Error(err)
			continue
		}
		total += st.Blocks * 512
	}
	return total
}

// location returns where key's record lives.
func location(t testing.TB, d *Tier, key chunk.Key) (path string, off int64) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	i, ok := d.idx.liveSlot(key)
	if !ok {
		t.Fatalf("%v not in the index", key)
	}
	s := d.idx.slots[i]
	return filepath.Join(d.dir, segmentName(s.seg)), s.off
}

// flipByte inverts one byte of a file in place.
func flipByte(t testing.TB, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
}

// mmapAligned returns n page-aligned bytes outside the Go heap, like the
// arena slices the tier is given in production.
func mmapAligned(t testing.TB, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}
