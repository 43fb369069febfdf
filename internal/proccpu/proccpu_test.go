package proccpu

import "testing"

// TestUsedGrows spins until the process's CPU time moves: a reader that
// always said 0 would fail.
func TestUsedGrows(t *testing.T) {
	start := Used()
	x := 0
	for i := 0; i < 1<<30 && Used() == start; i++ {
		x += i
	}
	if Used() <= start {
		t.Fatalf("CPU time stayed at %v (%d)", start, x)
	}
}
