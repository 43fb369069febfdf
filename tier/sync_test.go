package tier_test

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/tier"
	"kvtier/tier/mem"
)

// failTier refuses its first fails Puts, as a full or failing device would.
type failTier struct {
	*mem.Tier
	fails atomic.Int32
}

func (f *failTier) Put(ctx context.Context, k chunk.Key, b []byte) error {
	if f.fails.Add(-1) >= 0 {
		return errors.New("device says no")
	}
	return f.Tier.Put(ctx, k, b)
}

// refusingStall holds every Put until release, then lets failTier answer.
type refusingStall struct {
	*failTier
	release chan struct{}
}

func (s *refusingStall) Put(ctx context.Context, k chunk.Key, b []byte) error {
	<-s.release
	return s.failTier.Put(ctx, k, b)
}

// TestSyncWritesWhatWasDroppedOrRefused stores chunks while the lower tier
// is stalled (so most writes are dropped on a full queue) and refuses
// some: Sync must leave every stored chunk in the lower tier, with its
// bytes, and say how many it had to write again.
func TestSyncWritesWhatWasDroppedOrRefused(t *testing.T) {
	ram := newRAM(t, 16<<20)
	lowerRAM := newRAM(t, 16<<20)
	failing := &failTier{Tier: lowerRAM}
	failing.fails.Store(3)
	slow := &refusingStall{failTier: failing, release: make(chan struct{})}
	m, _ := tier.NewManager(ram, []tier.Tier{slow}, tier.Options{QueueDepth: 2, Writers: 1, WriteWait: -1})
	defer m.Close()
	ctx := context.Background()
	const n = 20
	for i := range n {
		if _, err := m.Store(ctx, []chunk.Key{key(i)}, [][]byte{payload(i, 4096)}); err != nil {
			t.Fatal(err)
		}
	}
	close(slow.release)
	rep, err := m.Sync(ctx)
	if err != nil || len(rep) != 1 {
		t.Fatalf("Sync = %+v, %v", rep, err)
	}
	redone := rep[0].Redone
	if rep[0].Missing > 0 {
		// How many of the 3 refusals the queued writes used up depends on
		// how many were queued before the queue filled; a refusal left
		// for Sync's own rewrite is reported missing and kept for the
		// next Sync, which must then finish the job.
		if rep, err = m.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		redone += rep[0].Redone
	}
	if rep[0].Pending != 0 || rep[0].Missing != 0 || redone < n-3 {
		t.Errorf("Sync report %+v (%d redone in all): want nothing pending or missing, at least %d redone",
			rep[0], redone, n-3)
	}
	buf := make([]byte, 4096)
	for i := range n {
		if got, err := lowerRAM.Get(ctx, key(i), buf); err != nil || !bytes.Equal(buf[:got], payload(i, 4096)) {
			t.Fatalf("chunk %d is not in the lower tier after Sync: %v", i, err)
		}
	}
}

// TestSyncReportsWhatItCouldNotFinish: with the lower tier stalled, Sync
// returns when its context ends, counting the queued writes as pending;
// a later Sync, once the tier moves, finds everything written.
func TestSyncReportsWhatItCouldNotFinish(t *testing.T) {
	ram := newRAM(t, 16<<20)
	lowerRAM := newRAM(t, 16<<20)
	slow := &stallTier{Tier: lowerRAM, release: make(chan struct{})}
	m, _ := tier.NewManager(ram, []tier.Tier{slow}, tier.Options{QueueDepth: 4, Writers: 1, WriteWait: -1})
	defer m.Close()
	ctx := context.Background()
	for i := range 3 {
		m.Store(ctx, []chunk.Key{key(i)}, [][]byte{payload(i, 4096)})
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	rep, err := m.Sync(short)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || rep[0].Pending != 3 {
		t.Fatalf("Sync on a stalled tier = %+v, %v; want 3 pending and the context's error", rep, err)
	}
	close(slow.release)
	rep, err = m.Sync(ctx)
	if err != nil || rep[0].Pending != 0 || rep[0].Missing != 0 {
		t.Fatalf("second Sync = %+v, %v", rep, err)
	}
	if got := lowerRAM.PrefixContains([]chunk.Key{key(0), key(1), key(2)}); got != 3 {
		t.Fatalf("%d of 3 chunks in the lower tier", got)
	}
}

// TestSyncKeepsReportingWhatIsLostForGood: a chunk whose write was refused
// and which then left RAM is on no lower tier, and every Sync after its
// store covers it, so every one must count it missing, not only the first
// — until it is stored again, removed or cleared.
func TestSyncKeepsReportingWhatIsLostForGood(t *testing.T) {
	ram := newRAM(t, 16<<20)
	failing := &failTier{Tier: newRAM(t, 16<<20)}
	failing.fails.Store(1 << 30)
	m, _ := tier.NewManager(ram, []tier.Tier{failing}, tier.Options{QueueDepth: 4, Writers: 1, WriteWait: -1})
	defer m.Close()
	ctx := context.Background()

	// lose stores k, waits for its write to be refused, then drops it from
	// RAM only, as an eviction would.
	lose := func(k chunk.Key, i int) {
		t.Helper()
		_, qs := m.Stats()
		before := qs[0].Failed
		if _, err := m.Store(ctx, []chunk.Key{k}, [][]byte{payload(i, 4096)}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for _, qs = m.Stats(); qs[0].Failed == before; _, qs = m.Stats() {
			if time.Now().After(deadline) {
				t.Fatal("the lower tier was never asked to write the chunk")
			}
			time.Sleep(time.Millisecond)
		}
		if !ram.Remove(k) {
			t.Fatalf("%v was not in RAM", k)
		}
	}
	missing := func(want int, when string) {
		t.Helper()
		rep, err := m.Sync(ctx)
		if err != nil || rep[0].Missing != want || rep[0].Pending != 0 {
			t.Fatalf("Sync %s = %+v, %v; want %d missing", when, rep, err, want)
		}
	}

	lose(key(1), 1)
	missing(1, "after the loss")
	missing(1, "again: the chunk is still acknowledged and on no disk")

	failing.fails.Store(0)
	if _, err := m.Store(ctx, []chunk.Key{key(1)}, [][]byte{payload(1, 4096)}); err != nil {
		t.Fatal(err)
	}
	missing(0, "after the chunk was stored again")

	failing.fails.Store(1 << 30)
	lose(key(2), 2)
	missing(1, "after a second loss")
	m.Remove(key(2))
	missing(0, "after the lost chunk was removed")

	lose(key(3), 3)
	missing(1, "after a third loss")
	m.Clear(key(3).Scope)
	missing(0, "after its scope was cleared")
}

// TestFlushRedoesRefusedWrites: a write the lower tier refused (as a remote
// tier's breaker does at its deadline under load) is not retried by the
// writers, so Flush must write it again before returning nil, and must
// return an error while the tier still refuses it.
func TestFlushRedoesRefusedWrites(t *testing.T) {
	ram := newRAM(t, 16<<20)
	failing := &failTier{Tier: newRAM(t, 16<<20)}
	failing.fails.Store(1)
	m, _ := tier.NewManager(ram, []tier.Tier{failing}, tier.Options{Writers: 1, WriteWait: time.Second})
	defer m.Close()
	ctx := context.Background()
	const n = 3
	for i := range n {
		if _, err := m.Store(ctx, []chunk.Key{key(i)}, [][]byte{payload(i, 4096)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Flush(ctx); err != nil {
		t.Fatalf("Flush after one refused write that succeeds again = %v", err)
	}
	for i := range n {
		if !failing.Contains(key(i)) {
			t.Errorf("Flush returned nil but chunk %d is not in the lower tier", i)
		}
	}

	failing.fails.Store(1 << 20) // refuses every write from now on
	if _, err := m.Store(ctx, []chunk.Key{key(n)}, [][]byte{payload(n, 4096)}); err != nil {
		t.Fatal(err)
	}
	if err := m.Flush(ctx); !errors.Is(err, tier.ErrNotDurable) {
		t.Fatalf("Flush while the lower tier refuses a stored chunk = %v, want ErrNotDurable", err)
	}
	failing.fails.Store(0)
	if err := m.Flush(ctx); err != nil || !failing.Contains(key(n)) {
		t.Fatalf("Flush once the tier takes writes again = %v, tier has the chunk: %v", err, failing.Contains(key(n)))
	}
}
