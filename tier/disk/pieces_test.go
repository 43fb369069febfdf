package disk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/zeebo/xxh3"

	"kvtier/chunk"
	"kvtier/tier"
)

// Tests of Get's piecewise read: records larger than readPiece are read in
// several preadvs and checksummed piece by piece as they land.

// TestStreamingHashMatchesFormat pins what the piecewise checksum relies on:
// xxh3.Hasher fed in any pieces gives xxh3.Hash of the whole, the digest the
// format stores.
func TestStreamingHashMatchesFormat(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	data := make([]byte, 3*readPiece+12345)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	sizes := []int{0, 1, 16, 128, 240, 241, 1024, 1088, 1089, 5000, 65536,
		readPiece - 1, readPiece, readPiece + 1, 2*readPiece + 4096, len(data)}
	for _, size := range sizes {
		b := data[:size]
		want := xxh3.Hash(b)
		for _, step := range []int{1 << 20, readPiece, 4096, 1000, 1} {
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

func TestProgressResetDropsStaleToken(t *testing.T) {
	p := newProgress()
	p.publish(10)
	p.publish(20) // the channel is full: must not block
	if got := p.n.Load(); got != 20 {
		t.Fatalf("filled %d after publishing 20", got)
	}
	p.reset()
	select {
	case <-p.landed:
		t.Fatal("a token survived reset")
	default:
	}
	if got := p.n.Load(); got != 0 {
		t.Fatalf("filled %d after reset", got)
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
	sizes := []int{readPiece, readPiece + 1, 2*readPiece + 3*blockSize, 2*readPiece + 5000}
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
// the last piece of a three-piece record: each must be caught, whichever
// piece the damage is in and whenever it was hashed.
func TestCorruptPieceOfLargeRecord(t *testing.T) {
	const size = 2*readPiece + 5000 // pieces of 4 MiB, 4 MiB, 5000 bytes (a partial block)
	spots := []struct {
		name string
		at   int
	}{
		{"first piece first byte", 0},
		{"first piece", 12345},
		{"middle piece", readPiece + 777},
		{"last piece first byte", 2 * readPiece},
		{"last byte", size - 1},
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
					flipByte(t, path, off+blockSize+int64(spot.at))
					if _, err := getInto(t, d, k, size, unaligned); !errors.Is(err, tier.ErrCorrupt) {
						t.Fatalf("%s damaged, unaligned %v: Get returned %v", spot.name, unaligned, err)
					}
					if d.Contains(k) {
						t.Fatalf("%s damaged: the record was not dropped", spot.name)
					}
				}
			}
			for _, unaligned := range []bool{false, true} {
				if got, err := getInto(t, d, intact, size, unaligned); err != nil || !bytes.Equal(got, data) {
					t.Fatalf("intact record (unaligned %v): %d bytes, %v", unaligned, len(got), err)
				}
			}
			if st := d.Stats(); st.Corrupt != uint64(2*len(spots)) || st.Objects != 1 {
				t.Fatalf("stats %+v; want %d corrupt and 1 object left", st, 2*len(spots))
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
	want := testPayload(k, 2*readPiece+100)
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
		queued = d.sched.queues[classRead].n == 1
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

func TestGetCanceledAfterAWorkerTookItCompletes(t *testing.T) {
	d := openTier(t, t.TempDir(), Options{Capacity: 1 << 30})
	defer d.Close()
	k := testKey(1)
	want := testPayload(k, 2*readPiece+100)
	mustPut(t, d, k, want)

	ctx, cancel := context.WithCancel(context.Background())
	swapSched(d, func(*worker, *op) bool {
		cancel() // the worker has the op: too late to withdraw it
		return false
	})
	dst := make([]byte, len(want))
	n, err := d.Get(ctx, k, dst)
	if err != nil || !bytes.Equal(dst[:n], want) {
		t.Fatalf("Get whose context ended once a worker had it: %d bytes, %v", n, err)
	}
}
