package server

import (
	"testing"
	"time"
)

// TestBudgetDeadlineFollowsTheTransfer: every RECEIVE batch of a transfer
// waits for budget only until the transfer's time is up, counted from its
// first batch on the connection, not a full hold from each batch; another
// transfer on the connection starts its own clock.
func TestBudgetDeadlineFollowsTheTransfer(t *testing.T) {
	var sc pdScratch
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ttl := time.Minute
	if got := sc.budgetDeadline(5, ttl, t0); !got.Equal(t0.Add(ttl)) {
		t.Fatalf("first batch: %v", got)
	}
	if got := sc.budgetDeadline(5, ttl, t0.Add(50*time.Second)); !got.Equal(t0.Add(ttl)) {
		t.Fatalf("a later batch of the transfer waits until %v, want %v", got, t0.Add(ttl))
	}
	t1 := t0.Add(70 * time.Second)
	if got := sc.budgetDeadline(6, ttl, t1); !got.Equal(t1.Add(ttl)) {
		t.Fatalf("the next transfer on the connection: %v", got)
	}
}
