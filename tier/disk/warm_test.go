package disk

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

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
