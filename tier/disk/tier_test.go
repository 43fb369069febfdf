package disk

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kvtier/chunk"
	"kvtier/tier"
)

// fsCases are the directories the round-trip test runs in: the test's temp
// directory (a disk file system here) with each I/O mode, and tmpfs.
func fsCases(t *testing.T) map[string]func() (string, Options) {
	cases := map[string]func() (string, Options){
		"buffered":    func() (string, Options) { return t.TempDir(), Options{DirectIO: DirectOff} },
		"auto":        func() (string, Options) { return t.TempDir(), Options{DirectIO: DirectAuto} },
		"sync-none":   func() (string, Options) { return t.TempDir(), Options{Sync: SyncNone} },
		"queue-depth": func() (string, Options) { return t.TempDir(), Options{QueueDepth: 4, BounceSize: 8192} },
	}
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		cases["tmpfs"] = func() (string, Options) {
			dir, err := os.MkdirTemp("/dev/shm", "kvtier-disk-test-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			return dir, Options{}
		}
	}
	return cases
}

func TestRoundTripSurvivesRestart(t *testing.T) {
	for name, setup := range fsCases(t) {
		t.Run(name, func(t *testing.T) {
			dir, opts := setup()
			opts.Capacity = 1 << 30
			opts.SegmentSize = 1 << 20
			d := openTier(t, dir, opts)
			t.Logf("direct I/O: %v", d.DirectIO())

			const n = 150
			want := map[chunk.Key][]byte{}
			var keys []chunk.Key
			for i := range uint64(n) {
				k := testKey(i)
				data := testPayload(k, testSize(i, 300<<10))
				if i%5 == 0 { // an unaligned caller buffer: staged through the bounce buffer
					data = append([]byte{0}, data...)[1:]
				}
				mustPut(t, d, k, data)
				want[k] = data
				keys = append(keys, k)
			}
			for _, k := range keys {
				checkGet(t, d, k, want[k])
				if sz, ok := d.Size(k); !ok || sz != len(want[k]) {
					t.Fatalf("Size(%v) = %d, %v; want %d", k, sz, ok, len(want[k]))
				}
			}
			if got := d.PrefixContains(append(keys[:10:10], testKey(999), keys[11])); got != 10 {
				t.Fatalf("PrefixContains = %d, want 10", got)
			}
			removed := map[chunk.Key]bool{}
			for i := 0; i < n; i += 7 {
				if !d.Remove(keys[i]) {
					t.Fatalf("Remove(%v) = false for a stored key", keys[i])
				}
				removed[keys[i]] = true
			}
			if d.Remove(keys[0]) {
				t.Fatal("second Remove reported the key present")
			}
			before := d.Stats()
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}

			d = openTier(t, dir, opts)
			defer d.Close()
			after := d.Stats()
			if after.Objects != int64(n-len(removed)) || after.Used != before.Used {
				t.Fatalf("after restart: %d objects using %d bytes; before: %d using %d",
					after.Objects, after.Used, before.Objects, before.Used)
			}
			for _, k := range keys {
				if removed[k] {
					if d.Contains(k) {
						t.Fatalf("removed %v came back after restart", k)
					}
					continue
				}
				checkGet(t, d, k, want[k]) // unaligned destination too
				dst := make([]byte, len(want[k])+1)
				if n, err := d.Get(context.Background(), k, dst[1:]); err != nil || !bytes.Equal(dst[1:1+n], want[k]) {
					t.Fatalf("Get(%v) into an unaligned buffer: %d bytes, %v", k, n, err)
				}
			}
		})
	}
}

func TestUsedMatchesRecordSizes(t *testing.T) {
	d := openTier(t, t.TempDir(), Options{Capacity: 1 << 30})
	defer d.Close()
	var want int64
	for i, size := range []int{0, 1, 4095, 4096, 4097, 100000} {
		mustPut(t, d, testKey(uint64(i)), make([]byte, size))
		want += recordSize(int64(size))
	}
	st := d.Stats()
	if st.Used != want || st.Objects != 6 || st.Puts != 6 || st.BytesWritten != 0+1+4095+4096+4097+100000 {
		t.Fatalf("stats %+v; want Used %d, 6 objects and puts", st, want)
	}
	if want != 6*4096+(0+4096+4096+4096+8192+102400) {
		t.Fatalf("recordSize arithmetic: %d", want)
	}
}

func TestRecordLargerThanSegment(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Capacity: 64 << 20, SegmentSize: 64 << 10}
	d := openTier(t, dir, opts)
	small, big := testKey(1), testKey(2)
	mustPut(t, d, small, testPayload(small, 10000))
	mustPut(t, d, big, testPayload(big, 3<<20))
	mustPut(t, d, testKey(3), testPayload(testKey(3), 10000))
	if got := len(segmentFiles(t, dir)); got != 3 {
		t.Fatalf("%d segment files, want 3 (the big record alone in the middle one)", got)
	}
	d.Close()
	d = openTier(t, dir, opts)
	defer d.Close()
	checkGet(t, d, big, testPayload(big, 3<<20))
	checkGet(t, d, small, testPayload(small, 10000))
}

func TestPutExistingKeyIsNoop(t *testing.T) {
	d := openTier(t, t.TempDir(), Options{Capacity: 1 << 20})
	defer d.Close()
	k := testKey(1)
	mustPut(t, d, k, []byte("first"))
	mustPut(t, d, k, []byte("second"))
	checkGet(t, d, k, []byte("first"))
	if st := d.Stats(); st.Puts != 1 || st.Objects != 1 {
		t.Fatalf("stats after duplicate put: %+v", st)
	}
}

func TestGetErrors(t *testing.T) {
	d := openTier(t, t.TempDir(), Options{Capacity: 1 << 20})
	k := testKey(1)
	mustPut(t, d, k, make([]byte, 5000))
	if _, err := d.Get(context.Background(), testKey(2), make([]byte, 10)); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("Get of a missing key: %v", err)
	}
	if _, err := d.Get(context.Background(), k, make([]byte, 4999)); !errors.Is(err, io.ErrShortBuffer) {
		t.Fatalf("Get into a short buffer: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.Get(ctx, k, make([]byte, 5000)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Get with a canceled context: %v", err)
	}
	if err := d.Put(ctx, testKey(3), []byte("x")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Put with a canceled context: %v", err)
	}
	if err := d.Put(context.Background(), testKey(4), make([]byte, 2<<20)); !errors.Is(err, tier.ErrTooLarge) {
		t.Fatalf("Put larger than capacity: %v", err)
	}
	st := d.Stats()
	if st.Hits != 0 || st.Misses != 1 {
		t.Fatalf("hits %d misses %d, want 0 and 1", st.Hits, st.Misses)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := d.Put(context.Background(), testKey(5), []byte("x")); !errors.Is(err, tier.ErrClosed) {
		t.Fatalf("Put after Close: %v", err)
	}
	if _, err := d.Get(context.Background(), k, make([]byte, 5000)); !errors.Is(err, tier.ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
}

func TestDirectoryLock(t *testing.T) {
	dir := t.TempDir()
	d := openTier(t, dir, Options{Capacity: 1 << 20})
	if _, err := Open(dir, Options{Capacity: 1 << 20}); err == nil {
		t.Fatal("a second Open of the same directory succeeded")
	}
	d.Close()
	openTier(t, dir, Options{Capacity: 1 << 20}).Close()
}

// refuseDirect makes openFile behave like a file system without O_DIRECT.
func refuseDirect(t *testing.T) {
	orig := openFile
	openFile = func(path string, flags int, perm uint32) (int, error) {
		if flags&unix.O_DIRECT != 0 {
			return -1, unix.EINVAL
		}
		return orig(path, flags, perm)
	}
	t.Cleanup(func() { openFile = orig })
}

func TestDirectIOModes(t *testing.T) {
	t.Run("auto-on-disk", func(t *testing.T) {
		d := openTier(t, t.TempDir(), Options{Capacity: 1 << 20})
		defer d.Close()
		var st unix.Statfs_t
		if err := unix.Statfs(d.dir, &st); err != nil {
			t.Fatal(err)
		}
		if st.Type == unix.EXT4_SUPER_MAGIC || st.Type == unix.XFS_SUPER_MAGIC {
			if !d.DirectIO() {
				t.Fatal("auto mode did not pick O_DIRECT on ext4/xfs")
			}
		}
	})
	t.Run("on", func(t *testing.T) {
		d := openTier(t, t.TempDir(), Options{Capacity: 1 << 20, DirectIO: DirectOn})
		defer d.Close()
		if !d.DirectIO() {
			t.Fatal("DirectOn opened without O_DIRECT")
		}
	})
	t.Run("off", func(t *testing.T) {
		d := openTier(t, t.TempDir(), Options{Capacity: 1 << 20, DirectIO: DirectOff})
		defer d.Close()
		if d.DirectIO() {
			t.Fatal("DirectOff opened with O_DIRECT")
		}
	})
	t.Run("refused", func(t *testing.T) {
		refuseDirect(t)
		if _, err := Open(t.TempDir(), Options{Capacity: 1 << 20, DirectIO: DirectOn}); !errors.Is(err, unix.EINVAL) {
			t.Fatalf("DirectOn where O_DIRECT is refused: %v", err)
		}
		dir := t.TempDir()
		d := openTier(t, dir, Options{Capacity: 1 << 20})
		if d.DirectIO() {
			t.Fatal("auto mode claims O_DIRECT where it is refused")
		}
		k := testKey(7)
		mustPut(t, d, k, testPayload(k, 12345))
		d.Close()
		d = openTier(t, dir, Options{Capacity: 1 << 20})
		defer d.Close()
		checkGet(t, d, k, testPayload(k, 12345))
	})
}

func TestBadOptions(t *testing.T) {
	for _, o := range []Options{{}, {Capacity: -1}, {Capacity: 1, DirectIO: 9}, {Capacity: 1, Sync: 9}} {
		if _, err := Open(t.TempDir(), o); err == nil {
			t.Fatalf("Open accepted %+v", o)
		}
	}
}

func TestLRUEviction(t *testing.T) {
	const size = 10000
	rec := recordSize(size)
	d := openTier(t, t.TempDir(), Options{Capacity: 4 * rec, Headroom: -1})
	defer d.Close()
	k := func(i int) chunk.Key { return testKey(uint64(i)) }
	for i := range 4 {
		mustPut(t, d, k(i), testPayload(k(i), size))
	}
	checkGet(t, d, k(0), testPayload(k(0), size)) // 0 becomes most recent: 1 is oldest
	mustPut(t, d, k(4), testPayload(k(4), size))
	if d.Contains(k(1)) || !d.Contains(k(0)) {
		t.Fatalf("evicted the wrong record: 0 present %v, 1 present %v", d.Contains(k(0)), d.Contains(k(1)))
	}
	// A record twice the size pushes out the two least recent: 2 and 3.
	mustPut(t, d, k(5), testPayload(k(5), 2*size))
	for i, want := range []bool{true, false, false, false, true, true} {
		if d.Contains(k(i)) != want {
			t.Fatalf("after the big put, Contains(%d) = %v", i, !want)
		}
	}
	st := d.Stats()
	if st.Evictions != 3 || st.Used > st.Capacity || st.Objects != 3 {
		t.Fatalf("stats %+v; want 3 evictions within capacity", st)
	}
}

func TestHeadroomEvictsAhead(t *testing.T) {
	const size = 10000
	rec := recordSize(size)
	d := openTier(t, t.TempDir(), Options{Capacity: 4 * rec, Headroom: rec})
	defer d.Close()
	for i := range 3 {
		mustPut(t, d, testKey(uint64(i)), testPayload(testKey(uint64(i)), size))
	}
	if st := d.Stats(); st.Evictions != 0 {
		t.Fatalf("evicted with the headroom still free: %+v", st)
	}
	mustPut(t, d, testKey(3), testPayload(testKey(3), size)) // fills the headroom
	if st := d.Stats(); st.Evictions != 1 || d.Contains(testKey(0)) || !d.Contains(testKey(3)) {
		t.Fatalf("the put into the headroom did not evict the oldest ahead: %+v", st)
	}
}

func TestPinsProtectUntilTheyLapse(t *testing.T) {
	const size = 10000
	rec := recordSize(size)
	d := openTier(t, t.TempDir(), Options{Capacity: 3 * rec, Headroom: -1})
	defer d.Close()
	k := func(i int) chunk.Key { return testKey(uint64(i)) }
	for i := range 3 {
		mustPut(t, d, k(i), testPayload(k(i), size))
	}
	if n := d.Pin([]chunk.Key{k(0), k(1), k(9), k(2)}, time.Hour); n != 2 {
		t.Fatalf("Pin pinned %d leading keys, want 2", n)
	}
	if st := d.Stats(); st.Pinned != 2*rec {
		t.Fatalf("Pinned = %d, want %d", st.Pinned, 2*rec)
	}
	mustPut(t, d, k(3), testPayload(k(3), size))
	if !d.Contains(k(0)) || !d.Contains(k(1)) || d.Contains(k(2)) {
		t.Fatal("eviction took a pinned record instead of the unpinned one")
	}
	d.Pin([]chunk.Key{k(3)}, time.Hour)
	if err := d.Put(context.Background(), k(4), testPayload(k(4), size)); !errors.Is(err, tier.ErrBusy) {
		t.Fatalf("Put with everything pinned: %v", err)
	}
	d.Pin([]chunk.Key{k(0)}, time.Millisecond) // does not shorten the hour
	if n := d.Pin([]chunk.Key{k(1)}, -time.Hour); n != 1 {
		t.Fatal("Pin of a stored key failed")
	}
	if err := d.Put(context.Background(), k(4), testPayload(k(4), size)); !errors.Is(err, tier.ErrBusy) {
		t.Fatalf("Put after Pin tried to shorten leases: %v", err)
	}

	short := openTier(t, t.TempDir(), Options{Capacity: rec, Headroom: -1})
	defer short.Close()
	mustPut(t, short, k(0), testPayload(k(0), size))
	short.Pin([]chunk.Key{k(0)}, time.Millisecond)
	time.Sleep(2 * time.Millisecond) // the lease lapses on its own
	mustPut(t, short, k(1), testPayload(k(1), size))
	if short.Contains(k(0)) || short.Stats().Pinned != 0 {
		t.Fatal("a lapsed pin still protected its record")
	}

	if short.Pin([]chunk.Key{k(1)}, time.Duration(math.MaxInt64)) != 1 { // must not overflow into the past
		t.Fatal("Pin of a stored key failed")
	}
	if err := short.Put(context.Background(), k(2), testPayload(k(2), size)); !errors.Is(err, tier.ErrBusy) {
		t.Fatalf("Put over a record pinned for all time: %v", err)
	}
}

func TestChurnKeepsDiskUsageBounded(t *testing.T) {
	dir := t.TempDir()
	const capacity = 2 << 20
	d := openTier(t, dir, Options{Capacity: capacity, SegmentSize: 256 << 10})
	var wg sync.WaitGroup
	var mu sync.Mutex
	maxUsed, maxAlloc := int64(0), int64(0)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				n := uint64(g*1000 + i)
				k := testKey(n)
				if err := d.Put(context.Background(), k, testPayload(k, testSize(n, 200<<10))); err != nil {
					t.Errorf("Put: %v", err)
					return
				}
				used := d.Stats().Used
				alloc := allocatedBytes(t, dir)
				mu.Lock()
				maxUsed, maxAlloc = max(maxUsed, used), max(maxAlloc, alloc)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	st := d.Stats()
	if maxUsed > capacity {
		t.Fatalf("accounted usage reached %d, capacity %d", maxUsed, capacity)
	}
	// The file system may add an extent block per fragmented file.
	slack := int64(len(segmentFiles(t, dir))) * 2 * blockSize
	if maxAlloc > capacity+slack {
		t.Fatalf("segment files occupied %d bytes, capacity %d", maxAlloc, capacity)
	}
	if st.Evictions == 0 || st.Puts != 240 {
		t.Fatalf("churn stats %+v", st)
	}
	t.Logf("max used %d, max allocated %d, %d segment files, %d evictions", maxUsed, maxAlloc, len(segmentFiles(t, dir)), st.Evictions)
	d.Close()
	d = openTier(t, dir, Options{Capacity: capacity, SegmentSize: 256 << 10})
	defer d.Close()
	// Used counts evicted bytes until their punch is durable, and st was
	// read while punches could still be queued: after the restart usage may
	// be lower, never higher, and the objects are the same.
	if got := d.Stats(); got.Used > st.Used || got.Objects != st.Objects {
		t.Fatalf("restart changed usage: %d/%d objects, was %d/%d", got.Used, got.Objects, st.Used, st.Objects)
	}
}

func TestReopenWithSmallerCapacityEvictsOldest(t *testing.T) {
	dir := t.TempDir()
	const size = 10000
	d := openTier(t, dir, Options{Capacity: 1 << 20})
	for i := range 6 {
		mustPut(t, d, testKey(uint64(i)), testPayload(testKey(uint64(i)), size))
	}
	d.Close()
	d = openTier(t, dir, Options{Capacity: 4 * recordSize(size), Headroom: -1})
	defer d.Close()
	for i := range 6 {
		if d.Contains(testKey(uint64(i))) != (i >= 2) {
			t.Fatalf("after shrinking, Contains(%d) = %v", i, !(i >= 2))
		}
	}
	if st := d.Stats(); st.Evictions != 2 || st.Used != 4*recordSize(size) {
		t.Fatalf("stats after shrinking: %+v", st)
	}
}

func TestConcurrentMixedOperations(t *testing.T) {
	d := openTier(t, t.TempDir(), Options{Capacity: 3 << 20, SegmentSize: 512 << 10, QueueDepth: 3})
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 150 {
				n := uint64((g*7 + i*13) % 64) // a small key space: heavy contention
				k := testKey(n)
				want := testPayload(k, testSize(n, 120<<10))
				switch i % 4 {
				case 0, 1:
					if err := d.Put(context.Background(), k, want); err != nil {
						t.Errorf("Put: %v", err)
						return
					}
				case 2:
					if err := getOutcome(t, d, k, want); errors.Is(err, tier.ErrCorrupt) {
						t.Errorf("Get(%v) reported corruption under concurrency: %v", k, err)
						return
					}
				default:
					if i%8 == 3 {
						d.Remove(k)
					} else {
						d.Pin([]chunk.Key{k}, time.Millisecond)
					}
				}
			}
		}()
	}
	wg.Wait()
	st := d.Stats()
	if st.Corrupt != 0 || st.Used > st.Capacity {
		t.Fatalf("stats after concurrent churn: %+v", st)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}

// copiesOnDisk counts the valid record headers for key in dir's segments,
// reading the files directly.
func copiesOnDisk(t *testing.T, dir string, key chunk.Key) int {
	t.Helper()
	n := 0
	for _, path := range segmentFiles(t, dir) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off+blockSize <= len(data); off += blockSize {
			if h, err := decodeHeader(data[off : off+blockSize]); err == nil && h.key == key {
				n++
			}
		}
	}
	return n
}

func TestRemoveWaitsForEveryCopy(t *testing.T) {
	const size = 20000
	dir := t.TempDir()
	d := openTier(t, dir, Options{Capacity: recordSize(size), Headroom: -1})
	defer d.Close()
	k, other := testKey(1), testKey(2)
	for range 3 { // each put evicts the other key: copies of k pile up until punched
		mustPut(t, d, k, testPayload(k, size))
		mustPut(t, d, other, testPayload(other, size))
	}
	mustPut(t, d, k, testPayload(k, size))
	if !d.Remove(k) {
		t.Fatal("Remove of a stored key returned false")
	}
	if n := copiesOnDisk(t, dir, k); n != 0 {
		t.Fatalf("%d copies of a removed key still on disk when Remove returned", n)
	}
	d.mu.Lock()
	ghosts := len(d.ghosts)
	d.mu.Unlock()
	if ghosts > 1 { // only other's last eviction may still be in flight
		t.Fatalf("%d keys with punches in flight", ghosts)
	}
}
