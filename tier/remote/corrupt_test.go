package remote

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/tier"
)

// testClock gives g a clock of the test's own and returns how to move it.
func testClock(g *Guarded) func(time.Duration) {
	var now atomic.Int64
	now.Store(time.Date(2026, 11, 26, 9, 0, 0, 0, time.UTC).UnixNano())
	g.now = func() time.Time { return time.Unix(0, now.Load()) }
	return func(d time.Duration) { now.Add(int64(d)) }
}

// TestCorruptReadsOpenTheCircuit: reads that fail verification count
// apart from failures. One among verified reads opens nothing; Threshold
// in a row do; so does a run in which more than a third of the reads are
// corrupt; none of it counts as a failure.
func TestCorruptReadsOpenTheCircuit(t *testing.T) {
	g := guard(t, pingFake{newFake()}, GuardOptions{Threshold: 3})
	g.ReportCorrupt()
	for range 3 {
		g.ReportVerified()
	}
	g.ReportCorrupt()
	g.ReportCorrupt()
	if h := g.Health(); h.State != StateClosed || h.Corrupt != 3 {
		t.Fatalf("two corrupt reads in a row after verified ones: %+v", h)
	}
	g.ReportCorrupt()
	if h := g.Health(); h.State != StateOpen || h.CorruptOpens != 1 || h.Opens != 1 || h.Failures != 0 {
		t.Fatalf("three corrupt reads in a row: %+v, want open for corruption", h)
	}

	g = guard(t, pingFake{newFake()}, GuardOptions{Threshold: 3})
	reads := 0
	for g.Health().State == StateClosed && reads < 100 { // one corrupt read in two
		g.ReportCorrupt()
		g.ReportVerified()
		reads += 2
	}
	if h := g.Health(); h.State != StateOpen || reads > 12 {
		t.Fatalf("half the reads corrupt: %+v after %d reads", h, reads)
	}
	g = guard(t, pingFake{newFake()}, GuardOptions{Threshold: 3})
	for range 100 { // one in four
		g.ReportCorrupt()
		g.ReportVerified()
		g.ReportVerified()
		g.ReportVerified()
	}
	if h := g.Health(); h.State != StateClosed {
		t.Fatalf("a quarter of the reads corrupt opened the circuit: %+v", h)
	}
}

// TestCorruptionBackoffAndProbation drives the probe by hand on the
// test's clock: probes are held for the back-off although the store
// answers pings; then two close the circuit, on probation; the first
// corrupt read reopens it at once, for twice the back-off, capped; the
// first verified read ends the probation and the back-off starts over.
func TestCorruptionBackoffAndProbation(t *testing.T) {
	f := newFake()
	g := guard(t, pingFake{f}, GuardOptions{Threshold: 2, CorruptBackoff: time.Minute, CorruptBackoffMax: 3 * time.Minute})
	advance := testClock(g)
	open := func(what string, held uint64) {
		t.Helper()
		if h := g.Health(); h.State != StateOpen || h.ProbesHeld != held {
			t.Fatalf("%s: %+v, want open with %d probes held", what, h, held)
		}
	}
	closeByProbes := func(what string) {
		t.Helper()
		g.probe()
		g.probe()
		if h := g.Health(); h.State != StateClosed {
			t.Fatalf("%s: two good probes left %+v", what, h)
		}
	}
	g.ReportCorrupt()
	g.ReportCorrupt()
	calls := f.calls.Load()
	g.probe()
	advance(59 * time.Second)
	g.probe()
	open("within the back-off", 2)
	if f.calls.Load() != calls {
		t.Fatal("a held probe asked the store")
	}
	advance(time.Second)
	closeByProbes("after the back-off")

	g.ReportCorrupt() // on probation: one is enough
	open("corrupt read on probation", 2)
	advance(time.Minute)
	g.probe()
	open("one back-off into the doubled one", 3)
	advance(time.Minute)
	closeByProbes("after the doubled back-off")
	for _, want := range []time.Duration{3 * time.Minute, 3 * time.Minute} { // 4 min, capped
		g.ReportCorrupt()
		advance(want - time.Second)
		g.probe()
		if h := g.Health(); h.State != StateOpen {
			t.Fatalf("back-off shorter than %v: %+v", want, h)
		}
		advance(time.Second)
		closeByProbes(fmt.Sprintf("after %v", want))
	}

	g.ReportVerified() // ends the probation, resets the back-off
	g.ReportCorrupt()
	if h := g.Health(); h.State != StateClosed {
		t.Fatalf("one corrupt read after the probation ended: %+v", h)
	}
	g.ReportCorrupt()
	advance(time.Minute)
	closeByProbes("after a reset back-off")
	if h := g.Health(); h.CorruptOpens != 5 || h.Failures != 0 {
		t.Fatalf("counters: %+v, want 5 openings for corruption and no failure", h)
	}
}

// TestCorruptTrialDoesNotClose: a half-open circuit whose trial read is
// ErrCorrupt from the store is not closed by it (as an answer would
// close it), and the read counts as corrupt.
func TestCorruptTrialDoesNotClose(t *testing.T) {
	f := newFake()
	g := guard(t, corruptingFake{f}, GuardOptions{Threshold: 5})
	g.state.Store(int32(StateHalfOpen))
	if _, err := g.Get(context.Background(), key(1), make([]byte, 4)); err == nil {
		t.Fatal("the damaged read succeeded")
	}
	if h := g.Health(); h.State != StateHalfOpen || h.Corrupt != 1 {
		t.Fatalf("after a corrupt trial: %+v", h)
	}
}

// corruptingFake answers every Get with ErrCorrupt, as a store that
// checks its own reads does when they fail.
type corruptingFake struct{ *fake }

func (c corruptingFake) Get(context.Context, chunk.Key, []byte) (int, error) {
	return 0, fmt.Errorf("fake: checksum mismatch: %w", tier.ErrCorrupt)
}
