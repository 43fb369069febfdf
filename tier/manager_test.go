package tier_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
	"kvtier/tier/disk"
	"kvtier/tier/mem"
)

func key(i int) chunk.Key {
	var k chunk.Key
	k.Scope = 1
	k.Hash[0], k.Hash[1], k.Hash[2] = byte(i), byte(i>>8), byte(i>>16)
	return k
}

func payload(i, size int) []byte {
	b := make([]byte, size)
	r := rand.New(rand.NewPCG(uint64(i), 99))
	for j := range b {
		b[j] = byte(r.Uint32())
	}
	return b
}

func newRAM(t *testing.T, capacity int64) *mem.Tier {
	t.Helper()
	a, err := arena.New(arena.Options{Capacity: capacity})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	m, err := mem.New(a, "LRU")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func newDisk(t *testing.T, dir string, capacity int64) *disk.Tier {
	t.Helper()
	d, err := disk.Open(dir, disk.Options{Capacity: capacity})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestStoreRetrieveFromRAM(t *testing.T) {
	ram := newRAM(t, 1<<20)
	m, err := tier.NewManager(ram, nil, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	keys := []chunk.Key{key(1), key(2), key(3)}
	chunks := [][]byte{payload(1, 4096), payload(2, 8192), payload(3, 100)}
	if n, err := m.Store(ctx, keys, chunks); err != nil || n != 3 {
		t.Fatalf("Store = %d, %v", n, err)
	}
	dst := [][]byte{make([]byte, 8192), make([]byte, 8192), make([]byte, 8192)}
	n, err := m.Retrieve(ctx, keys, dst)
	if err != nil || n != 3 {
		t.Fatalf("Retrieve = %d, %v", n, err)
	}
	for i := range chunks {
		if !bytes.Equal(dst[i], chunks[i]) {
			t.Fatalf("chunk %d: got %d bytes, differs from stored", i, len(dst[i]))
		}
	}
	// A missing middle key cuts the prefix.
	n, _ = m.Retrieve(ctx, []chunk.Key{key(1), key(9), key(3)}, dst)
	if n != 1 {
		t.Fatalf("prefix through a miss: got %d chunks, want 1", n)
	}
	if got, by, last := m.Lookup([]chunk.Key{key(1), key(2), key(9)}); got != 2 || by[0] != 2 || last != 0 {
		t.Fatalf("Lookup = %d %v, want 2 in RAM", got, by)
	}
}

func TestRetrieveShortBufferIsError(t *testing.T) {
	ram := newRAM(t, 1<<20)
	m, _ := tier.NewManager(ram, nil, tier.Options{})
	defer m.Close()
	ctx := context.Background()
	m.Store(ctx, []chunk.Key{key(1), key(2)}, [][]byte{payload(1, 4096), payload(2, 4096)})
	n, err := m.Retrieve(ctx, []chunk.Key{key(1), key(2)}, [][]byte{make([]byte, 4096), make([]byte, 10)})
	if err == nil || n != 1 {
		t.Fatalf("Retrieve with short second buffer = %d, %v; want 1 and an error", n, err)
	}
	if p := ram.Arena().Pinned(); p != 0 {
		t.Fatalf("pinned bytes after retrieve = %d, want 0", p)
	}
}

// TestWaterfallAndPromotion stores more than RAM holds, so early chunks
// survive only on disk; a retrieve must read them from disk, promote them
// into RAM and return the original bytes.
func TestWaterfallAndPromotion(t *testing.T) {
	const size = 64 << 10
	ram := newRAM(t, 8*size)
	d := newDisk(t, t.TempDir(), 64<<20)
	m, err := tier.NewManager(ram, []tier.Tier{d}, tier.Options{WriteWait: -1 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	var keys []chunk.Key
	var chunks [][]byte
	for i := range 32 {
		keys = append(keys, key(i))
		chunks = append(chunks, payload(i, size))
		// One at a time with a flush, so no write is dropped.
		if _, err := m.Store(ctx, keys[i:], chunks[i:]); err != nil {
			t.Fatal(err)
		}
		if err := m.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	n, by, _ := m.Lookup(keys)
	if n != 32 || by[0]+by[1] != 32 || by[1] == 0 {
		t.Fatalf("Lookup = %d %v; want 32 with some on disk", n, by)
	}
	if ram.Contains(keys[0]) {
		t.Fatal("chunk 0 should have been evicted from RAM")
	}
	dst := make([][]byte, 4)
	for i := range dst {
		dst[i] = make([]byte, size)
	}
	got, err := m.Retrieve(ctx, keys[:4], dst)
	if err != nil || got != 4 {
		t.Fatalf("Retrieve from disk = %d, %v", got, err)
	}
	for i := range dst {
		if !bytes.Equal(dst[i], chunks[i]) {
			t.Fatalf("chunk %d from disk differs", i)
		}
	}
	if !ram.Contains(keys[0]) || m.Promoted() < 4 {
		t.Fatalf("chunk 0 not promoted into RAM (promoted %d)", m.Promoted())
	}
	if p := ram.Arena().Pinned(); p != 0 {
		t.Fatalf("pinned bytes after retrieve = %d, want 0", p)
	}
	if u, c := ram.Arena().Used(), ram.Arena().Capacity(); u > c {
		t.Fatalf("arena used %d > capacity %d", u, c)
	}
}

// TestCloseFlushesWrites checks that Close finishes queued disk writes, so
// a restart finds every stored chunk.
func TestCloseFlushesWrites(t *testing.T) {
	dir := t.TempDir()
	ram := newRAM(t, 16<<20)
	d := newDisk(t, dir, 64<<20)
	m, _ := tier.NewManager(ram, []tier.Tier{d}, tier.Options{QueueDepth: 256, WriteWait: time.Second})
	ctx := context.Background()
	var keys []chunk.Key
	var chunks [][]byte
	for i := range 100 {
		keys = append(keys, key(i))
		chunks = append(chunks, payload(i, 16<<10))
	}
	if n, err := m.Store(ctx, keys, chunks); err != nil || n != 100 {
		t.Fatalf("Store = %d, %v", n, err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Store(ctx, keys[:1], chunks[:1]); !errors.Is(err, tier.ErrClosed) {
		t.Fatalf("Store after Close = %v, want ErrClosed", err)
	}
	d2 := newDisk(t, dir, 64<<20)
	defer d2.Close()
	buf := make([]byte, 16<<10)
	for i, k := range keys {
		n, err := d2.Get(ctx, k, buf)
		if err != nil || !bytes.Equal(buf[:n], chunks[i]) {
			t.Fatalf("chunk %d after restart: %d bytes, %v", i, n, err)
		}
	}
}

// stallTier is a lower tier whose Put blocks until released: it stands in
// for a slow device so the test can fill the manager's queue.
type stallTier struct {
	*mem.Tier
	release chan struct{}
}

func (s *stallTier) Put(ctx context.Context, k chunk.Key, b []byte) error {
	<-s.release
	return s.Tier.Put(ctx, k, b)
}

// TestBackpressureDropsInsteadOfBlocking fills a stalled tier's queue; later
// stores must return (dropping that tier's writes and counting them)
// rather than wait for the tier.
func TestBackpressureDropsInsteadOfBlocking(t *testing.T) {
	ram := newRAM(t, 16<<20)
	slow := &stallTier{Tier: newRAM(t, 16<<20), release: make(chan struct{})}
	m, _ := tier.NewManager(ram, []tier.Tier{slow}, tier.Options{QueueDepth: 2, Writers: 1, WriteWait: time.Millisecond})
	ctx := context.Background()
	// The first write occupies the only writer; wait until it has taken it.
	m.Store(ctx, []chunk.Key{key(0)}, [][]byte{payload(0, 4096)})
	for _, qs := m.Stats(); qs[0].Depth != 0; _, qs = m.Stats() {
		time.Sleep(time.Millisecond)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; i < 20; i++ {
			if _, err := m.Store(ctx, []chunk.Key{key(i)}, [][]byte{payload(i, 4096)}); err != nil {
				t.Error(err)
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Store blocked on a stalled lower tier")
	}
	_, qs := m.Stats()
	// 20 stores; the writer holds 1 job, the queue 2: the rest dropped.
	if qs[0].Dropped != 17 {
		t.Fatalf("dropped %d writes, want 17", qs[0].Dropped)
	}
	close(slow.release)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if p := ram.Arena().Pinned(); p != 0 {
		t.Fatalf("pinned bytes after close = %d, want 0", p)
	}
}

// TestConcurrentMixedLoad runs stores and retrieves of overlapping keys
// from many goroutines over a RAM tier smaller than the key space and a
// disk tier; every retrieved chunk must carry its own bytes, and the arena
// must end empty of pins and never be over capacity. RAM is sized above
// what can be pinned at once (8 readers × 2 chunks, 8 queued and 2 in
// flight writes), since pinned objects cannot be evicted.
func TestConcurrentMixedLoad(t *testing.T) {
	const size = 32 << 10
	ram := newRAM(t, 40*size)
	d := newDisk(t, t.TempDir(), 256*size)
	m, _ := tier.NewManager(ram, []tier.Tier{d}, tier.Options{QueueDepth: 8})
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			dst := [][]byte{make([]byte, size), make([]byte, size)}
			for range 200 {
				i := r.IntN(64)
				keys := []chunk.Key{key(i), key(i + 1)}
				if r.IntN(2) == 0 {
					m.Store(ctx, keys, [][]byte{payload(i, size), payload(i+1, size)})
					continue
				}
				n, err := m.Retrieve(ctx, keys, dst)
				if err != nil {
					t.Error(err)
					return
				}
				for j := range n {
					if !bytes.Equal(dst[j], payload(i+j, size)) {
						t.Errorf("key %d returned wrong bytes", i+j)
						return
					}
				}
				if u, c := ram.Arena().Used(), ram.Arena().Capacity(); u > c {
					t.Errorf("arena used %d > capacity %d", u, c)
				}
			}
		})
	}
	wg.Wait()
	if m.Promoted() == 0 {
		t.Error("no chunk was promoted from disk: the load never exercised the waterfall")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if p := ram.Arena().Pinned(); p != 0 {
		t.Fatalf("pinned bytes at end = %d, want 0", p)
	}
	if u := ram.Arena().Used(); u != 0 {
		t.Fatalf("arena used after close = %d, want 0", u)
	}
}

func TestPrefetchPromotes(t *testing.T) {
	const size = 16 << 10
	ram := newRAM(t, 4*size)
	d := newDisk(t, t.TempDir(), 64<<20)
	m, _ := tier.NewManager(ram, []tier.Tier{d}, tier.Options{WriteWait: time.Second})
	defer m.Close()
	ctx := context.Background()
	for i := range 8 {
		if _, err := m.Store(ctx, []chunk.Key{key(i)}, [][]byte{payload(i, size)}); err != nil {
			t.Fatal(err)
		}
		m.Flush(ctx)
	}
	if ram.Contains(key(0)) {
		t.Fatal("key 0 should be on disk only")
	}
	if !m.Prefetch([]chunk.Key{key(0), key(1)}) {
		t.Fatal("prefetch not queued")
	}
	deadline := time.Now().Add(10 * time.Second)
	for !(ram.Contains(key(0)) && ram.Contains(key(1))) {
		if time.Now().After(deadline) {
			t.Fatal("prefetch never promoted keys 0 and 1")
		}
		time.Sleep(time.Millisecond)
	}
}

func Example() {
	a, _ := arena.New(arena.Options{Capacity: 1 << 20})
	defer a.Close()
	ram, _ := mem.New(a, "LRU")
	m, _ := tier.NewManager(ram, nil, tier.Options{})
	defer m.Close()
	k := key(42)
	m.Store(context.Background(), []chunk.Key{k}, [][]byte{[]byte("kv bytes")})
	dst := [][]byte{make([]byte, 64)}
	n, _ := m.Retrieve(context.Background(), []chunk.Key{k}, dst)
	fmt.Println(n, string(dst[0]))
	// Output: 1 kv bytes
}

// TestWaterfallPerKey covers a prefix whose chunks are spread over the
// tiers out of order: RAM, disk, RAM. Retrieve must take each chunk from
// wherever it is rather than stop where RAM's own prefix ends.
func TestWaterfallPerKey(t *testing.T) {
	const size = 4096
	ram := newRAM(t, 1<<20)
	d := newDisk(t, t.TempDir(), 16<<20)
	m, _ := tier.NewManager(ram, []tier.Tier{d}, tier.Options{WriteWait: time.Second})
	defer m.Close()
	ctx := context.Background()
	keys := []chunk.Key{key(0), key(1), key(2)}
	chunks := [][]byte{payload(0, size), payload(1, size), payload(2, size)}
	if _, err := m.Store(ctx, keys, chunks); err != nil {
		t.Fatal(err)
	}
	m.Flush(ctx)
	ram.Remove(keys[1]) // chunk 1 now lives on disk only
	d.Remove(keys[2])   // chunk 2 in RAM only
	if n, by, _ := m.Lookup(keys); n != 3 || by[0] != 2 || by[1] != 1 {
		t.Fatalf("Lookup = %d %v, want 3: chunks 0 and 2 from RAM, 1 from disk", n, by)
	}
	dst := [][]byte{make([]byte, size), make([]byte, size), make([]byte, size)}
	n, err := m.Retrieve(ctx, keys, dst)
	if err != nil || n != 3 {
		t.Fatalf("Retrieve = %d, %v; want all 3", n, err)
	}
	for i := range chunks {
		if !bytes.Equal(dst[i], chunks[i]) {
			t.Fatalf("chunk %d differs", i)
		}
	}
	if ram.Arena().Pinned() != 0 {
		t.Fatal("pins left after retrieve")
	}
}

// TestStoreWithTwoStalledTiersReturns: with every lower tier stalled and
// its queue full, one Store must spend at most one WriteWait in all and
// return, for every tier, rather than wait on a timer that already fired.
func TestStoreWithTwoStalledTiersReturns(t *testing.T) {
	ram := newRAM(t, 16<<20)
	s1 := &stallTier{Tier: newRAM(t, 16<<20), release: make(chan struct{})}
	s2 := &stallTier{Tier: newRAM(t, 16<<20), release: make(chan struct{})}
	m, _ := tier.NewManager(ram, []tier.Tier{s1, s2}, tier.Options{QueueDepth: 1, Writers: 1, WriteWait: 5 * time.Millisecond})
	ctx := context.Background()
	for i := range 2 { // key 0 occupies each writer, key 1 fills each queue
		m.Store(ctx, []chunk.Key{key(i)}, [][]byte{payload(i, 4096)})
		for _, qs := m.Stats(); i == 0 && (qs[0].Depth != 0 || qs[1].Depth != 0); _, qs = m.Stats() {
			time.Sleep(time.Millisecond)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Store(ctx, []chunk.Key{key(2), key(3)}, [][]byte{payload(2, 4096), payload(3, 4096)})
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Store blocked on stalled tiers")
	}
	if _, qs := m.Stats(); qs[0].Dropped != 2 || qs[1].Dropped != 2 {
		t.Fatalf("dropped %d and %d writes, want 2 each", qs[0].Dropped, qs[1].Dropped)
	}
	close(s1.release)
	close(s2.release)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRetrieveFromDiskLongerThanRAM: a prefix on disk eight times larger
// than RAM still retrieves whole, in windows, because promoted chunks are
// released window by window; and Acquire, which must hold everything at
// once, returns the prefix that fits without an error.
func TestRetrieveFromDiskLongerThanRAM(t *testing.T) {
	const size = 16 << 10
	dir := t.TempDir()
	d := newDisk(t, dir, 64<<20)
	ctx := context.Background()
	keys := make([]chunk.Key, 40*8)
	chunks := make([][]byte, len(keys))
	for i := range keys {
		keys[i], chunks[i] = key(i), payload(i, size)
		if err := d.Put(ctx, keys[i], chunks[i]); err != nil {
			t.Fatal(err)
		}
	}
	ram := newRAM(t, 40*size)
	m, _ := tier.NewManager(ram, []tier.Tier{d}, tier.Options{})
	defer m.Close()
	dst := make([][]byte, len(keys))
	for i := range dst {
		dst[i] = make([]byte, size)
	}
	n, err := m.Retrieve(ctx, keys, dst)
	if err != nil || n != len(keys) {
		t.Fatalf("Retrieve = %d, %v; want all %d", n, err, len(keys))
	}
	for i := range keys {
		if !bytes.Equal(dst[i], chunks[i]) {
			t.Fatalf("chunk %d differs", i)
		}
	}
	ids := make([]arena.ID, len(keys))
	n, err = m.Acquire(ctx, keys, ids)
	if err != nil || n == 0 || n > 40 {
		t.Fatalf("Acquire = %d, %v; want a non-empty prefix that fits RAM and no error", n, err)
	}
	for _, id := range ids[:n] {
		ram.Arena().Unref(id)
	}
	if p := ram.Arena().Pinned(); p != 0 {
		t.Fatalf("pinned after release = %d", p)
	}
}

// TestRemoveWinsOverQueuedWrite: a chunk removed while its lower-tier
// write is still queued must not come back when the write lands.
func TestRemoveWinsOverQueuedWrite(t *testing.T) {
	ram := newRAM(t, 16<<20)
	slow := &stallTier{Tier: newRAM(t, 16<<20), release: make(chan struct{})}
	m, _ := tier.NewManager(ram, []tier.Tier{slow}, tier.Options{Writers: 1, WriteWait: time.Second})
	ctx := context.Background()
	k := key(7)
	if _, err := m.Store(ctx, []chunk.Key{k}, [][]byte{payload(7, 4096)}); err != nil {
		t.Fatal(err)
	}
	m.Remove(k)
	close(slow.release)
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := m.Lookup([]chunk.Key{k}); n != 0 || slow.Contains(k) {
		t.Fatalf("removed chunk came back: lookup %d, lower tier has it: %v", n, slow.Contains(k))
	}
	m.Close()
}

// TestStoreRefillsALowerTier: a chunk whose disk write was dropped (here:
// removed from disk behind the manager's back) is written again when it
// is stored again, though RAM already holds it.
func TestStoreRefillsALowerTier(t *testing.T) {
	ram := newRAM(t, 1<<20)
	d := newDisk(t, t.TempDir(), 16<<20)
	m, _ := tier.NewManager(ram, []tier.Tier{d}, tier.Options{WriteWait: time.Second})
	defer m.Close()
	ctx := context.Background()
	k, b := key(3), payload(3, 8192)
	m.Store(ctx, []chunk.Key{k}, [][]byte{b})
	m.Flush(ctx)
	d.Remove(k)
	if n, err := m.Store(ctx, []chunk.Key{k}, [][]byte{b}); n != 1 || err != nil {
		t.Fatalf("Store = %d, %v", n, err)
	}
	m.Flush(ctx)
	got := make([]byte, 8192)
	if n, err := d.Get(ctx, k, got); err != nil || !bytes.Equal(got[:n], b) {
		t.Fatalf("disk after second store: %d bytes, %v", n, err)
	}
}

// brokenTier is a lower tier that holds its keys but fails every read, as
// a remote store does when its connection resets.
type brokenTier struct{ *mem.Tier }

var errReset = errors.New("read: connection reset by peer")

func (b brokenTier) Get(context.Context, chunk.Key, []byte) (int, error) { return 0, errReset }

// TestLowerTierReadFailureIsAMiss: a lower tier that fails a read ends the
// prefix there without an error, since the engine can always recompute;
// only the caller's own cancellation is reported.
func TestLowerTierReadFailureIsAMiss(t *testing.T) {
	lower := newRAM(t, 16<<20)
	ctx := context.Background()
	for i := range 3 {
		if err := lower.Put(ctx, key(i), payload(i, 4096)); err != nil {
			t.Fatal(err)
		}
	}
	m, err := tier.NewManager(newRAM(t, 16<<20), []tier.Tier{brokenTier{lower}}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	keys := []chunk.Key{key(0), key(1), key(2)}
	dst := [][]byte{make([]byte, 4096), make([]byte, 4096), make([]byte, 4096)}
	if n, err := m.Retrieve(ctx, keys, dst); n != 0 || err != nil {
		t.Fatalf("Retrieve over a failing lower tier = %d, %v; want a miss", n, err)
	}
	if m.ReadFailed() == 0 {
		t.Error("the failed reads were not counted")
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := m.Retrieve(cancelled, keys, dst); !errors.Is(err, context.Canceled) {
		t.Errorf("Retrieve with a cancelled context = %v, want context.Canceled", err)
	}
	if p := m.RAM().Arena().Pinned(); p != 0 {
		t.Errorf("%d bytes still pinned after failed reads", p)
	}
}

// refuseTier is a lower tier that refuses every write, as a full disk does.
type refuseTier struct{ *mem.Tier }

var errRefused = errors.New("no space left on device")

func (refuseTier) Put(context.Context, chunk.Key, []byte) error { return errRefused }

// TestRefusedWritesAreCountedNotFlooded stores through a tier that refuses
// every write: each refusal is counted, but the log gets a line per
// interval, not one per write.
func TestRefusedWritesAreCountedNotFlooded(t *testing.T) {
	var logBuf syncBuffer
	ram := newRAM(t, 16<<20)
	m, _ := tier.NewManager(ram, []tier.Tier{refuseTier{newRAM(t, 16<<20)}},
		tier.Options{QueueDepth: 512, WriteWait: time.Second, Logger: slog.New(slog.NewTextHandler(&logBuf, nil))})
	const n = 300
	for i := range n {
		if _, err := m.Store(context.Background(), []chunk.Key{key(i)}, [][]byte{payload(i, 4096)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Close(); err != nil { // waits for the queued writes
		t.Fatal(err)
	}
	_, qs := m.Stats()
	if qs[0].Failed != n {
		t.Fatalf("failed writes = %d, want %d", qs[0].Failed, n)
	}
	lines := strings.Count(logBuf.String(), "lower tier write failed")
	if lines < 1 || lines > n/10 {
		t.Fatalf("%d log lines for %d refused writes, want a handful", lines, n)
	}
}

// syncBuffer is a bytes.Buffer that writers on several goroutines may share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
