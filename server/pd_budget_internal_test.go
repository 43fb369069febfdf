package server

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

// A request waiting for the receive budget in a goroutine of its own.
type budgetRequest struct {
	w    *waiter
	done chan error
}

func waitBudget(b *budget, ctx context.Context, n int64, deadline time.Time, early bool) *budgetRequest {
	r := &budgetRequest{w: &waiter{wake: make(chan struct{}, 1)}, done: make(chan error, 1)}
	go func() { r.done <- b.acquire(ctx, n, deadline, r.w, early) }()
	return r
}

// queued waits until the budget's queue is n long (the requests sent have
// reached it: no sleeping on a guess).
func queued(t *testing.T, b *budget, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); b.waiting() != n; runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests wait for the budget, want %d", b.waiting(), n)
		}
	}
}

// budgetHolding returns a budget of 4 bytes of which held took n, on
// its first request.
func budgetHolding(t *testing.T, n int64) (*budget, *waiter) {
	t.Helper()
	b, held := &budget{limit: 4}, &waiter{wake: make(chan struct{}, 1)}
	if err := b.acquire(context.Background(), n, time.Now().Add(time.Hour), held, false); err != nil {
		t.Fatal(err)
	}
	return b, held
}

// pending reports whether r has not returned yet.
func (r *budgetRequest) pending() bool { return len(r.done) == 0 }

func (r *budgetRequest) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("a request granted its budget did not return")
		return nil
	}
}

// TestBudgetServesInArrivalOrder: bytes freed go to the first waiter; a
// later request that would fit waits behind it, and gets its turn once the
// first is served.
func TestBudgetServesInArrivalOrder(t *testing.T) {
	b, _ := budgetHolding(t, 3)
	ctx, far := context.Background(), time.Now().Add(time.Hour)
	large := waitBudget(b, ctx, 4, far, false)
	queued(t, b, 1)
	small := waitBudget(b, ctx, 1, far, false)
	queued(t, b, 2) // 1 byte is free, and it waits: the large one came first
	b.release(3)
	if err := large.result(t); err != nil {
		t.Fatal(err)
	}
	if !small.pending() || b.used() != 4 {
		t.Fatalf("after the release: small pending %v, %d bytes used; want the large request served alone", small.pending(), b.used())
	}
	b.release(4)
	if err := small.result(t); err != nil || b.used() != 1 || b.waiting() != 0 {
		t.Fatalf("the small request: %v, %d used, %d waiting", err, b.used(), b.waiting())
	}
}

// TestBudgetLetsTransfersInProgressPass: a request of a transfer that
// took budget before takes free bytes past the waiters; one that gives up
// (shutdown) leaves the queue and lets those behind it that fit go.
func TestBudgetLetsTransfersInProgressPass(t *testing.T) {
	b, first := budgetHolding(t, 1)
	ctx, far := context.Background(), time.Now().Add(time.Hour)
	lctx, cancel := context.WithCancel(ctx)
	large := waitBudget(b, lctx, 4, far, false)
	queued(t, b, 1)
	if err := b.acquire(ctx, 2, far, first, true); err != nil || b.used() != 3 {
		t.Fatalf("the next request of a transfer in progress: %v, %d used", err, b.used())
	}
	small := waitBudget(b, ctx, 1, far, false)
	queued(t, b, 2)
	cancel()
	if err := large.result(t); !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled waiter: %v", err)
	}
	if err := small.result(t); err != nil || b.used() != 4 || b.waiting() != 0 {
		t.Fatalf("behind a waiter that left: %v, %d used, %d waiting", err, b.used(), b.waiting())
	}
	// A deadline past while it waits: refused, and nothing taken.
	if err := b.acquire(ctx, 1, time.Now(), first, false); !errors.Is(err, errBudget) || b.used() != 4 || b.waiting() != 0 {
		t.Fatalf("past its deadline: %v, %d used, %d waiting", err, b.used(), b.waiting())
	}
	if err := b.acquire(ctx, 5, far, first, false); err == nil || errors.Is(err, errBudget) {
		t.Fatalf("a request larger than the budget: %v, want refused at once", err)
	}
}

// TestBudgetWaitAllocs: a wait for budget, served by a release, allocates
// nothing once the session's waiter has its timer.
func TestBudgetWaitAllocs(t *testing.T) {
	if underRace {
		t.Skip("the race detector allocates")
	}
	b := &budget{limit: 2}
	w := &waiter{wake: make(chan struct{}, 1)}
	ctx, far := context.Background(), time.Now().Add(time.Hour)
	start, got := make(chan struct{}), make(chan error)
	defer close(start)
	go func() {
		for range start {
			got <- b.acquire(ctx, 2, far, w, false)
		}
	}()
	held := &waiter{wake: make(chan struct{}, 1)}
	allocs := testing.AllocsPerRun(100, func() {
		if err := b.acquire(ctx, 1, far, held, false); err != nil {
			t.Fatal(err)
		}
		start <- struct{}{}
		for b.waiting() == 0 {
			runtime.Gosched()
		}
		b.release(1)
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		b.release(2)
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per wait for budget", allocs)
	}
}

// TestBudgetServesTransfersInProgressFirst: bytes freed go to a queued
// request of a transfer in progress before a new transfer at the head
// that would fit too. Budget 10: transfer A holds 6 and its reader waits
// for all of A's bytes; finished transfer C holds 3; new transfer B's 4
// queue as head and A's next 3 behind it. When C is read, A must get its
// 3: given to B, A and B would each wait for bytes only the other's
// reader frees.
func TestBudgetServesTransfersInProgressFirst(t *testing.T) {
	b := &budget{limit: 10}
	ctx, far := context.Background(), time.Now().Add(time.Hour)
	a, c := &waiter{wake: make(chan struct{}, 1)}, &waiter{wake: make(chan struct{}, 1)}
	if err := b.acquire(ctx, 6, far, a, false); err != nil {
		t.Fatal(err)
	}
	if err := b.acquire(ctx, 3, far, c, false); err != nil {
		t.Fatal(err)
	}
	newB := waitBudget(b, ctx, 4, far, false)
	queued(t, b, 1)
	nextA := waitBudget(b, ctx, 3, far, true)
	queued(t, b, 2)
	b.release(3) // C is read
	if err := nextA.result(t); err != nil {
		t.Fatalf("the transfer in progress: %v", err)
	}
	if !newB.pending() || b.used() != 9 || b.waiting() != 1 {
		t.Fatalf("after C's release: new transfer pending %v, %d used, %d waiting; want A's 3 served and B waiting", newB.pending(), b.used(), b.waiting())
	}
	b.release(9) // A is read
	if err := newB.result(t); err != nil || b.used() != 4 || b.waiting() != 0 {
		t.Fatalf("the new transfer: %v, %d used, %d waiting", err, b.used(), b.waiting())
	}
}
