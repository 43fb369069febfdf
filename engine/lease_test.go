package engine_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/engine"
)

// storedKeys stores a prompt of n chunks and returns its keys.
func storedKeys(t *testing.T, e *engine.Engine, n int, seed uint64) []chunk.Key {
	t.Helper()
	toks := tokens(n*chunkTokens, seed)
	req := engine.Request{Scope: scope, Tokens: toks}
	if got, err := e.Store(context.Background(), req, chunksOf(toks, 0, n)); got != n || err != nil {
		t.Fatalf("store: %d, %v", got, err)
	}
	keys, _, _, err := e.Keys(nil, req)
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func TestLeaseRule(t *testing.T) {
	e, err := engine.Open(engine.Options{ChunkSize: chunkTokens, RAMBytes: 1 << 20, Policy: "LRU",
		LeaseTTL: 3 * time.Second, MaxLeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, c := range []struct{ asked, want time.Duration }{
		{0, 3 * time.Second},            // none asked: the default
		{time.Second, time.Second},      // what was asked
		{time.Hour, time.Minute},        // capped
		{-time.Second, 3 * time.Second}, // nonsense counts as none
	} {
		if got := e.LeaseTTL(c.asked); got != c.want {
			t.Errorf("LeaseTTL(%v) = %v, want %v", c.asked, got, c.want)
		}
	}
	d := open(t, 1<<20, "", false)
	if d.LeaseTTL(0) != engine.DefaultLeaseTTL || d.LeaseTTL(time.Hour) != engine.MaxLeaseTTL {
		t.Errorf("defaults: %v and %v", d.LeaseTTL(0), d.LeaseTTL(time.Hour))
	}
}

// TestLeaseHoldsMemoryUntilItEnds covers each way a lease ends: release,
// expiry at its deadline (after a renewal moved it), and closing.
func TestLeaseHoldsMemoryUntilItEnds(t *testing.T) {
	e := open(t, 4<<20, "", false)
	keys := storedKeys(t, e, 4, 1)
	slots, id, err := e.PrepareRetrieve(context.Background(), keys, time.Minute, nil)
	if err != nil || id == 0 || len(slots) != 4 {
		t.Fatalf("prepare retrieve: %d slots, lease %d, %v", len(slots), id, err)
	}
	if e.Arena().Pinned() == 0 || e.Stats().Arena.Leases != 1 {
		t.Fatalf("a retrieve lease pins nothing: pinned %d, leases %d", e.Arena().Pinned(), e.Stats().Arena.Leases)
	}
	if !e.Release(id) || e.Release(id) || e.LeaseActive(id) {
		t.Fatal("a lease must release once")
	}
	if e.Arena().Pinned() != 0 {
		t.Fatalf("released lease still pins %d bytes", e.Arena().Pinned())
	}

	_, id, _ = e.PrepareRetrieve(context.Background(), keys, time.Second, nil)
	if !e.Renew(id, time.Minute) {
		t.Fatal("renew of an active lease failed")
	}
	if n := e.ExpireLeases(time.Now().Add(30 * time.Second)); n != 0 {
		t.Fatalf("renewed lease expired %d early", n)
	}
	if n := e.ExpireLeases(time.Now().Add(2 * time.Minute)); n != 1 || e.LeasesExpired() != 1 {
		t.Fatalf("expired %d (total %d), want 1", n, e.LeasesExpired())
	}
	if e.Renew(id, time.Minute) || e.Arena().Pinned() != 0 {
		t.Fatal("an expired lease renewed, or still pins memory")
	}

	_, id, _ = e.PrepareRetrieve(context.Background(), keys, time.Minute, nil)
	if !e.LeaseActive(id) {
		t.Fatal("lease not active")
	}
	e.Close()
	if e.LeaseActive(id) {
		t.Fatal("lease outlived the engine")
	}
}

// TestLeaseIDsAreNotReused checks that a slot given to a new lease does
// not revive the id of the lease that had it.
func TestLeaseIDsAreNotReused(t *testing.T) {
	e := open(t, 4<<20, "", false)
	keys := storedKeys(t, e, 2, 2)
	old := e.PinHit(keys, 0)
	e.Release(old)
	fresh := e.PinHit(keys, 0)
	if fresh == old || e.Release(old) || !e.LeaseActive(fresh) {
		t.Fatalf("old %#x, fresh %#x: the old id must stay dead", old, fresh)
	}
}

func TestCommitStore(t *testing.T) {
	e := open(t, 4<<20, "", false)
	toks := tokens(3*chunkTokens, 3)
	keys, _, _, err := e.Keys(nil, engine.Request{Scope: scope, Tokens: toks})
	if err != nil {
		t.Fatal(err)
	}
	sizes := []uint32{512, 512, 512}
	slots, id, err := e.PrepareStore(keys, sizes, 0, nil)
	if err != nil || id == 0 || len(slots) != 3 || slots[0].Stored {
		t.Fatalf("prepare store: %+v, lease %d, %v", slots, id, err)
	}
	if n, err := e.CommitStore(id, 2); n != 2 || err != nil {
		t.Fatalf("commit: %d, %v", n, err)
	}
	if n, _ := e.LookupKeys(keys); n != 2 {
		t.Fatalf("after committing 2 of 3, %d are cached", n)
	}
	if _, err := e.CommitStore(id, 2); !errors.Is(err, engine.ErrUnknownLease) {
		t.Fatalf("second commit: %v", err)
	}
	slots, id, _ = e.PrepareStore(keys, sizes, 0, slots[:0])
	if !slots[0].Stored || !slots[1].Stored || slots[2].Stored {
		t.Fatalf("cached chunks must come back stored: %+v", slots)
	}
	e.Release(id)
	if e.Arena().Stats().Objects != 2 {
		t.Fatalf("a released store lease left %d objects, want the 2 committed", e.Arena().Stats().Objects)
	}
	pin := e.PinHit(keys, 0)
	if _, err := e.CommitStore(pin, 1); !errors.Is(err, engine.ErrNotStoreLease) || e.LeaseActive(pin) {
		t.Fatalf("committing a lookup lease: %v, still active %v", err, e.LeaseActive(pin))
	}
}

func TestLeaseCycleDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	e := open(t, 16<<20, "", false)
	keys := storedKeys(t, e, 16, 4)
	ctx := context.Background()
	slots := make([]engine.Slot, 0, len(keys))
	cycle := func() {
		var id engine.LeaseID
		slots, id, _ = e.PrepareRetrieve(ctx, keys, 0, slots[:0])
		e.Renew(id, time.Minute)
		e.Release(id)
		e.Release(e.PinHit(keys, 0))
	}
	cycle() // the first lease grows the table
	if a := testing.AllocsPerRun(100, cycle); a != 0 {
		t.Errorf("a lease cycle: %.1f allocations, want 0", a)
	}
}

// TestLeasesUnderConcurrency races building, committing, releasing,
// renewing and expiring leases (run it with -race); every reference must
// be returned at the end.
func TestLeasesUnderConcurrency(t *testing.T) {
	e := open(t, 8<<20, "", false)
	keys := storedKeys(t, e, 8, 5)
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var slots []engine.Slot
			for i := range 200 {
				var id engine.LeaseID
				slots, id, _ = e.PrepareRetrieve(ctx, keys, time.Duration(i%3)*time.Millisecond, slots[:0])
				switch (g + i) % 4 {
				case 0:
					e.Release(id)
				case 1:
					e.Renew(id, time.Millisecond)
				case 2:
					e.CommitStore(id, 1) // not a store lease: ends it
				}
				e.Release(e.PinHit(keys[:2], time.Millisecond))
				if i%50 == 0 {
					e.ExpireLeases(time.Now().Add(time.Second))
				}
			}
		}()
	}
	wg.Wait()
	e.ExpireLeases(time.Now().Add(time.Hour))
	if st := e.Stats(); st.Arena.Leases != 0 || st.Arena.PinnedBytes != 0 {
		t.Fatalf("after every lease ended: %d leases, %d bytes pinned", st.Arena.Leases, st.Arena.PinnedBytes)
	}
}
