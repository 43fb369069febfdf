package disk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"

	"github.com/zeebo/xxh3"

	"kvtier/chunk"
	"kvtier/tier"
)

// Tests of Get's piecewise read: records larger than pieceSize are read as
// several ops in parallel and checksummed piece by piece as they land.

// TestStreamingHashMatchesFormat pins what the piecewise checksum relies on:
// xxh3.Hasher fed in any pieces gives xxh3.Hash of the whole, the digest the
// format stores.
func TestStreamingHashMatchesFormat(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	data := make([]byte, 3*pieceSize+12345)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	sizes := []int{0, 1, 16, 128, 240, 241, 1024, 1088, 1089, 5000, 65536,
		pieceSize - 1, pieceSize, pieceSize + 1, 2*pieceSize + 4096, len(data)}
	for _, size := range sizes {
		b := data[:size]
		want := xxh3.Hash(b)
		for _, step := range []int{1 << 20, pieceSize, 4096, 1000, 1} {
			if size/step > 1<<16 {
				continue // byte-sized steps only for small inputs
			}
			var h xxh3.Hasher
			for pos := 0; pos < size; pos += step {
				h.Write(b[pos:min(pos+step, size)])
			}
			if got := h.Sum64(); got != want {
				t.Fatalf("%d bytes hashed in steps of %d: %#x, one shot %#x", size, step, got, want)
			}
		}
		var h xxh3.Hasher // uneven pieces, some empty
		for pos := 0; pos < size; {
			end := min(pos+r.IntN(3*blockSize), size)
			h.Write(b[pos:end])
			pos = end
		}
		if got := h.Sum64(); got != want {
			t.Fatalf("%d bytes hashed in random pieces: %#x, one shot %#x", size, got, want)
		}
	}
}

// getInto reads key into a destination of exactly size bytes: page aligned
// (read straight into with O_DIRECT) or one byte off (staged through the
// bounce buffer).
func getInto(t *testing.T, d *Tier, key chunk.Key, size int, unaligned bool) ([]byte, error) {
	t.Helper()
	dst := mmapAligned(t, size+blockSize)
	if unaligned {
		dst = dst[1:]
	}
	dst = dst[:size]
	n, err := d.Get(context.Background(), key, dst)
	return dst[:n], err
}

func TestLargeRecordsRoundTrip(t *testing.T) {
	sizes := []int{pieceSize, pieceSize + 1, 2*pieceSize + 3*blockSize, 2*pieceSize + 5000}
	for _, mode := range []DirectMode{DirectAuto, DirectOff} {
		t.Run(fmt.Sprintf("direct-mode-%d", mode), func(t *testing.T) {
			d := openTier(t, t.TempDir(), Options{Capacity: 1 << 30, DirectIO: mode, BounceSize: 3 * blockSize})
			defer d.Close()
			for i, size := range sizes {
				k := testKey(uint64(i))
				want := testPayload(k, size)
				mustPut(t, d, k, want)
				for _, unaligned := range []bool{false, true} {
					got, err := getInto(t, d, k, size, unaligned)
					if err != nil || !bytes.Equal(got, want) {
						t.Fatalf("Get of %d bytes (unaligned %v): %d bytes, %v", size, unaligned, len(got), err)
					}
				}
			}
			if st := d.Stats(); st.Hits != uint64(2*len(sizes)) || st.Corrupt != 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// TestCorruptPieceOfLargeRecord damages one byte in the first, a middle or
// the last piece of a three-piece record, or in its header, or cuts the
// file short in the middle piece: each must be caught, whichever piece the
// damage is in and whenever it was hashed.
func TestCorruptPieceOfLargeRecord(t *testing.T) {
	const size = 2*pieceSize + 5000 // pieces of 4 MiB, 4 MiB, 5000 bytes (a partial block)
	spots := []struct {
		name string
		at   int64 // from the record's start
	}{
		{"header", 40},
		{"first piece first byte", blockSize},
		{"first piece", blockSize + 12345},
		{"middle piece", blockSize + pieceSize + 777},
		{"last piece first byte", blockSize + 2*pieceSize},
		{"last byte", blockSize + size - 1},
	}
	for _, mode := range []DirectMode{DirectAuto, DirectOff} {
		t.Run(fmt.Sprintf("direct-mode-%d", mode), func(t *testing.T) {
			d := openTier(t, t.TempDir(), Options{Capacity: 1 << 30, DirectIO: mode})
			defer d.Close()
			intact := testKey(1000)
			data := testPayload(intact, size)
			mustPut(t, d, intact, data)
			var n uint64
			for _, spot := range spots {
				for _, unaligned := range []bool{false, true} {
					k := testKey(n)
					n++
					mustPut(t, d, k, data)
					path, off := location(t, d, k)
					flipByte(t, path, off+spot.at)
					if _, err := getInto(t, d, k, size, unaligned); !errors.Is(err, tier.ErrCorrupt) {
						t.Fatalf("%s damaged, unaligned %v: Get returned %v", spot.name, unaligned, err)
					}
					if d.Contains(k) {
						t.Fatalf("%s damaged: the record was not dropped", spot.name)
					}
				}
			}
			cut := testKey(n) // the last record in the file: cutting it short harms no other
			mustPut(t, d, cut, data)
			path, off := location(t, d, cut)
			if err := os.Truncate(path, off+blockSize+pieceSize+100); err != nil {
				t.Fatal(err)
			}
			if _, err := getInto(t, d, cut, size, false); !errors.Is(err, tier.ErrCorrupt) {
				t.Fatalf("record cut short in its middle piece: Get returned %v", err)
			}
			for _, unaligned := range []bool{false, true} {
				if got, err := getInto(t, d, intact, size, unaligned); err != nil || !bytes.Equal(got, data) {
					t.Fatalf("intact record (unaligned %v): %d bytes, %v", unaligned, len(got), err)
				}
			}
			if st, want := d.Stats(), uint64(2*len(spots)+1); st.Corrupt != want || st.Objects != 1 {
				t.Fatalf("stats %+v; want %d corrupt and 1 object left", st, want)
			}
		})
	}
}

// swapSched replaces d's scheduler by a one-worker one that runs hook
// before every op, so a test can act at the moment a worker takes an op.
func swapSched(d *Tier, hook func(*worker, *op) (handled bool)) {
	d.sched.close()
	d.sched = newSched(1, d.opts.BounceSize, func(w *worker, o *op) {
		if !hook(w, o) {
			d.exec(w, o)
		}
	})
}

func TestGetCanceledWhileQueuedIsWithdrawn(t *testing.T) {
	d := openTier(t, t.TempDir(), Options{Capacity: 1 << 30})
	defer d.Close()
	k := testKey(1)
	want := testPayload(k, 2*pieceSize+100)
	mustPut(t, d, k, want)

	started, gate := make(chan struct{}), make(chan struct{})
	swapSched(d, func(_ *worker, o *op) bool {
		if o.off != -1 {
			return false
		}
		close(started)
		<-gate
		o.done <- struct{}{}
		return true
	})
	hold := &op{kind: opWrite, off: -1, done: make(chan struct{}, 1)}
	d.sched.submit(hold)
	<-started

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := d.Get(ctx, k, make([]byte, len(want)))
		errc <- err
	}()
	for queued := false; !queued; { // wait until the Get's read is queued behind the held worker
		d.sched.mu.Lock()
		queued = d.sched.queues[classRead].n > 0
		d.sched.mu.Unlock()
		runtime.Gosched()
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Get canceled while queued: %v", err)
	}
	close(gate)
	<-hold.done
	checkGet(t, d, k, want) // the withdrawn op went back to the pool in good order
	if st := d.Stats(); st.Corrupt != 0 || st.Hits != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestGetCanceledWhileReading ends a Get's context once a worker has its
// first piece: that piece is seen through (it is being read into the
// caller's buffer), the later ones may be withdrawn or read; either way the
// Get reports success with the right bytes or the context's error, and the
// tier stays sound.
func TestGetCanceledWhileReading(t *testing.T) {
	d := openTier(t, t.TempDir(), Options{Capacity: 1 << 30})
	defer d.Close()
	k := testKey(1)
	want := testPayload(k, 3*pieceSize+100)
	mustPut(t, d, k, want)

	ctx, cancel := context.WithCancel(context.Background())
	swapSched(d, func(_ *worker, o *op) bool {
		if o.from == 0 {
			cancel() // the worker has the op: too late to withdraw it
		}
		return false
	})
	dst := make([]byte, len(want))
	n, err := d.Get(ctx, k, dst)
	switch {
	case errors.Is(err, context.Canceled):
	case err != nil || !bytes.Equal(dst[:n], want):
		t.Fatalf("Get whose context ended while a worker read it: %d bytes, %v", n, err)
	}
	checkGet(t, d, k, want)
	if st := d.Stats(); st.Corrupt != 0 || st.Objects != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestLargeGetDoesNotAllocate: a multi-piece Get takes its ops from the
// pool and hashes on the stack, so once the pool is warm it allocates
// nothing.
func TestLargeGetDoesNotAllocate(t *testing.T) {
	d := openTier(t, t.TempDir(), Options{Capacity: 1 << 30})
	defer d.Close()
	k := testKey(1)
	mustPut(t, d, k, testPayload(k, 3*pieceSize+100))
	dst := mmapAligned(t, 3*pieceSize+100)
	ctx := context.Background()
	// A collection empties the runtime's caches of wait records that
	// blocking on channels and conditions draws on; refilling them is
	// counted as allocations. Collect first, and average over enough Gets
	// that a refill shows as less than one allocation per Get.
	runtime.GC()
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := d.Get(ctx, k, dst); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per Get", allocs)
	}
}
