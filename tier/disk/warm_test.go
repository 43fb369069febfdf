package disk

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"kvtier/chunk"
)

// TestWarmingServesAndQueues opens a full tier from its checkpoint with the
// policy goroutine held back, and checks that reads are served meanwhile,
// that hits, a Remove and a Put are queued for the policy, and that a Put
// that must evict waits for it; then that the tier ends as one whose policy
// was ready before the same operations: same records, same victim, same
// eviction order.
func TestWarmingServesAndQueues(t *testing.T) {
	const n, size = 200, 1000
	opts := Options{Capacity: n * recordSize(size), Headroom: -1, SegmentSize: 64 * recordSize(size),
		CheckpointRecords: 1 << 30, CheckpointInterval: -1}
	dir := t.TempDir()
	d := openTier(t, dir, opts)
	for i := range uint64(n) {
		mustPut(t, d, testKey(i), testPayload(testKey(i), size))
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	ref := filepath.Join(t.TempDir(), "ref")
	if out, err := exec.Command("cp", "-a", "--sparse=always", dir, ref).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}

	release := make(chan struct{})
	warmHold = func() { <-release }
	d = openTier(t, dir, opts)
	warmHold = nil
	if !d.Recovered().Checkpoint {
		t.Fatal("the checkpoint was not used")
	}
	work := func(d *Tier) chunk.Key {
		for i := range uint64(50) {
			checkGet(t, d, testKey(i), testPayload(testKey(i), size))
		}
		if !d.Remove(testKey(60)) {
			t.Fatal("Remove found nothing")
		}
		mustPut(t, d, testKey(1000), testPayload(testKey(1000), size)) // fits: no eviction
		return testKey(1001)
	}
	last := work(d)
	d.mu.Lock()
	queued, warm := 0, d.idx.warm != nil
	if warm {
		queued = len(d.idx.warm.queued)
	}
	d.mu.Unlock()
	if !warm || queued != 52 {
		t.Fatalf("while the policy is held: warming %v, %d operations queued, want 52", warm, queued)
	}
	put := make(chan error, 1)
	go func() { put <- d.Put(context.Background(), last, testPayload(last, size)) }() // must evict
	close(release)
	if err := <-put; err != nil {
		t.Fatal(err)
	}

	r := openTier(t, ref, opts)
	r.WaitPolicy()
	mustPut(t, r, work(r), testPayload(last, size))

	got, want := stateOf(d), stateOf(r)
	abandon(d)
	abandon(r)
	if len(got.recs) != len(want.recs) || got.used != want.used {
		t.Fatalf("held: %d records, %d bytes; ready: %d records, %d bytes", len(got.recs), got.used, len(want.recs), want.used)
	}
	for k := range want.recs {
		if _, ok := got.recs[k]; !ok {
			t.Fatalf("%v: evicted when the policy was held, kept when it was ready", k)
		}
	}
	if !slices.Equal(got.order, want.order) {
		t.Fatal("the eviction order differs from a tier whose policy was ready")
	}
}

// heldRestart stores n records of size bytes in a tier of the given
// capacity, closes it and opens it again, with the default headroom, from
// its checkpoint with the policy goroutine held until the returned release
// is called.
func heldRestart(t *testing.T, n, size int, capacity int64) (d *Tier, release func()) {
	t.Helper()
	opts := Options{Capacity: capacity, Headroom: -1, SegmentSize: 64 * recordSize(int64(size)),
		CheckpointRecords: 1 << 30, CheckpointInterval: -1}
	dir := t.TempDir()
	d = openTier(t, dir, opts) // no headroom: all n fit in n records' capacity
	opts.Headroom = 0          // the default from here on
	for i := range uint64(n) {
		mustPut(t, d, testKey(i), testPayload(testKey(i), size))
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	warmHold = func() { <-hold }
	d = openTier(t, dir, opts)
	warmHold = nil
	if !d.Recovered().Checkpoint {
		t.Fatal("the checkpoint was not used")
	}
	var once sync.Once
	release = func() { once.Do(func() { close(hold) }) }
	t.Cleanup(func() {
		release()
		d.Close()
	})
	return d, release
}

// policyHeld reports whether d's policy is still taking in what Open
// restored.
func policyHeld(d *Tier) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.idx.policyReady()
}

// TestEvictingPutWaitsWithoutTheLock: a Put into a full tier whose policy
// is still held waits for it, and meanwhile every read and lookup is
// served. Were the Put waiting with the tier's lock, the reads below would
// never return (the policy is released only after them).
func TestEvictingPutWaitsWithoutTheLock(t *testing.T) {
	const n, size = 200, 1000
	d, release := heldRestart(t, n, size, n*recordSize(size))
	waiting := make(chan struct{}, 1)
	warmWaiting = func() { waiting <- struct{}{} }
	defer func() { warmWaiting = nil }()
	key := testKey(5000)
	put := make(chan error, 1)
	go func() { put <- d.Put(context.Background(), key, testPayload(key, size)) }()
	<-waiting // the Put needs a victim and waits for the policy

	checkGet(t, d, testKey(1), testPayload(testKey(1), size))
	if !d.Contains(testKey(2)) || d.PrefixContains([]chunk.Key{testKey(3), testKey(4)}) != 2 {
		t.Fatal("a stored record is not found")
	}
	if _, ok := d.Size(testKey(5)); !ok {
		t.Fatal("Size found nothing")
	}
	listed := 0
	d.List(testKey(0).Scope, func(chunk.Key, int) bool { listed++; return true })
	if listed == 0 {
		t.Fatal("List found nothing")
	}
	if !d.Remove(testKey(7)) {
		t.Fatal("Remove found nothing")
	}
	if st := d.Stats(); st.Evictions != 0 {
		t.Fatalf("%d evictions while the policy is held", st.Evictions)
	}
	select {
	case err := <-put:
		t.Fatalf("the Put returned (%v) while the policy was held", err)
	default:
	}
	if !policyHeld(d) {
		t.Fatal("the policy is ready before it was released")
	}

	release()
	if err := <-put; err != nil {
		t.Fatal(err)
	}
	checkGet(t, d, key, testPayload(key, size))
	if d.Stats().Evictions == 0 {
		t.Fatal("the Put into a full tier evicted nothing")
	}
}

// TestPutWithinHeadroomDoesNotWait: a restarted tier that has room for a
// record, but less than its headroom, stores it without waiting for the
// policy, and evicts ahead once the policy is ready.
func TestPutWithinHeadroomDoesNotWait(t *testing.T) {
	const n, size = 198, 1000
	capacity := 200 * recordSize(size) // headroom: capacity/64, about 3 records; 2 are free
	d, release := heldRestart(t, n, size, capacity)
	key := testKey(5000)
	mustPut(t, d, key, testPayload(key, size))
	if !policyHeld(d) {
		t.Fatal("the policy is ready before it was released")
	}
	if st := d.Stats(); st.Evictions != 0 {
		t.Fatalf("%d evictions while the policy is held", st.Evictions)
	}
	release()
	d.WaitPolicy()
	for i := range uint64(10) {
		k := testKey(6000 + i)
		mustPut(t, d, k, testPayload(k, size))
	}
	d.mu.Lock()
	free := d.room.Capacity - (d.used - d.punching)
	d.mu.Unlock()
	if free < d.opts.Headroom {
		t.Fatalf("%d bytes free or being freed once the policy is ready, headroom %d", free, d.opts.Headroom)
	}
}

// TestFullQueueWaitsWithoutTheLock: once the queue of operations for a
// held policy is full, a Get waits for the policy before it takes the
// tier's lock, so lookups go on; the Get is served once the policy is
// ready, and the queue is applied.
func TestFullQueueWaitsWithoutTheLock(t *testing.T) {
	const n, size = 50, 1000
	d, release := heldRestart(t, n, size, 4*n*recordSize(size))
	d.mu.Lock()
	for len(d.idx.warm.queued) < maxQueuedOps {
		d.idx.warm.queued = append(d.idx.warm.queued, polOp{kind: polAccess, key: testKey(1)})
	}
	d.mu.Unlock()
	checkGet(t, d, testKey(2), testPayload(testKey(2), size)) // queued past the bound: the queue is full now
	waiting := make(chan struct{}, 1)
	warmWaiting = func() { waiting <- struct{}{} }
	defer func() { warmWaiting = nil }()
	got := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		_, err := d.Get(context.Background(), testKey(3), buf)
		got <- err
	}()
	<-waiting
	if !d.Contains(testKey(4)) {
		t.Fatal("Contains found nothing")
	}
	_ = d.Stats()
	select {
	case err := <-got:
		t.Fatalf("the Get returned (%v) while the policy was held with a full queue", err)
	default:
	}
	release()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	d.WaitPolicy()
	if d.idx.full.Load() != nil {
		t.Fatal("the queue still counts as full")
	}
}

// TestWaitPolicyAfterEviction: WaitPolicy reports when the policy was
// ready even when a Put waited for it first.
func TestWaitPolicyAfterEviction(t *testing.T) {
	const n, size = 100, 1000
	d, release := heldRestart(t, n, size, n*recordSize(size))
	put := make(chan error, 1)
	go func() { put <- d.Put(context.Background(), testKey(5000), testPayload(testKey(5000), size)) }()
	hold := time.Now()
	release()
	if err := <-put; err != nil {
		t.Fatal(err)
	}
	// The policy was ready after the release, which came after Open
	// returned; Open's own duration would be earlier.
	if got := d.recStart.Add(d.WaitPolicy()); got.Before(hold) {
		t.Fatalf("WaitPolicy reports the policy ready %v before it was released", hold.Sub(got))
	}
}
