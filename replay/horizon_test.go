package replay

import (
	"fmt"
	"testing"
)

// TestReuseDistances checks the stack distances of a hand-made trace
// against counting by hand.
func TestReuseDistances(t *testing.T) {
	// Requests of single-block prompts: a b c a b b d a
	var reqs []Request
	for _, id := range []uint64{1, 2, 3, 1, 2, 2, 4, 1} {
		reqs = append(reqs, Request{InputLength: BlockSize, HashIDs: []uint64{id}})
	}
	got := reuseDistances(compile(reqs))
	inf := int(^uint(0) >> 1)
	want := []int{inf, inf, inf, 2, 2, 0, inf, 2}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("distances %v, want %v", got, want)
	}
}

// TestHorizonSplitsOPTHits: four blocks in turn (a b c d a b ...) are each
// reused at a distance of 3. With room for two blocks every hit OPT gets is
// beyond the horizon; with room for three, none is.
func TestHorizonSplitsOPTHits(t *testing.T) {
	var reqs []Request
	for i := range 40 {
		reqs = append(reqs, Request{InputLength: BlockSize, HashIDs: []uint64{uint64(i % 4)}})
	}
	h := HorizonOf(reqs, 2)
	if h.OPTHits == 0 || h.OPTHitsBeyond != h.OPTHits {
		t.Fatalf("four blocks in turn, room for two: OPT hits %d, beyond the horizon %d; want all beyond", h.OPTHits, h.OPTHitsBeyond)
	}
	if opt := SimulateOPT(reqs, 2); h.OPTHits != opt.HitBlocks {
		t.Fatalf("horizon counts %d OPT hits, the simulation %d", h.OPTHits, opt.HitBlocks)
	}
	past, returned := 0, 0
	for _, c := range h.Classes {
		past += c.Past
		returned += c.Returned
	}
	if past != 40 || returned != 36 {
		t.Fatalf("decision points past the horizon %d (returned %d), want 40 (36)", past, returned)
	}
	if h := HorizonOf(reqs, 3); h.OPTHits == 0 || h.OPTHitsBeyond != 0 {
		t.Fatalf("room for three: %d of %d hits beyond a horizon that a reuse distance of 3 does not pass", h.OPTHitsBeyond, h.OPTHits)
	}
}

// TestHorizonReport prints the horizon split of the shared conversation
// trace and the synthetic ones at 2, 5 and 10 % (docs/bench.md):
//
//	go test -run TestHorizonReport -v ./replay
func TestHorizonReport(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	traces := []struct {
		name string
		reqs []Request
	}{{"conversation", readRealTrace(t)}}
	for _, k := range []string{SynthChat, SynthRAG} {
		reqs, err := Synthesize(k, 1, 12000)
		if err != nil {
			t.Fatal(err)
		}
		traces = append(traces, struct {
			name string
			reqs []Request
		}{k, reqs})
	}
	for _, tr := range traces {
		blocks := Summarize(tr.reqs).DistinctBlocks
		for _, f := range []float64{0.02, 0.05, 0.10} {
			h := HorizonOf(tr.reqs, int(f*float64(blocks)))
			line := fmt.Sprintf("%-12s %3.0f%%  OPT hits beyond the horizon %5.1f%%  returned after passing it:", tr.name, 100*f, 100*float64(h.OPTHitsBeyond)/float64(max(h.OPTHits, 1)))
			all, ret := 0, 0
			for _, c := range h.Classes {
				all += c.Past
				ret += c.Returned
				tail := "inner"
				if c.Tail {
					tail = "tail"
				}
				line += fmt.Sprintf("  uses %d %s %.2f (%d)", c.Uses, tail, float64(c.Returned)/float64(c.Past), c.Past)
			}
			t.Logf("%s  all %.2f", line, float64(ret)/float64(max(all, 1)))
		}
	}
}
