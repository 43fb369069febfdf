package replay

import (
	"flag"
	"os"
	"testing"

	"kvtier/internal/citest"
	"kvtier/tier/policy"
)

var chartPath = flag.String("chart", "", "write the real trace's hit-rate chart (SVG) to this file")

// readRealTrace reads the public Mooncake conversation trace from
// ../shared beside the checkout.
func readRealTrace(t *testing.T) []Request {
	t.Helper()
	f, err := os.Open(citest.Shared(t, "traces", "conversation_trace.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	reqs, err := ReadTrace(f)
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

// TestRealTrace checks the figures the trace's README publishes and logs
// every policy against OPT at 10% of the distinct blocks.
func TestRealTrace(t *testing.T) {
	reqs := readRealTrace(t)
	sum := Summarize(reqs)
	if sum != (Summary{Requests: 12031, BlockRefs: 288500, DistinctBlocks: 182790, Tokens: sum.Tokens}) {
		t.Errorf("summary %+v does not match the README's 12,031 requests, 288,500 references, 182,790 blocks", sum)
	}
	if sum.Tokens < 144_750_000 || sum.Tokens >= 144_850_000 {
		t.Errorf("%d prompt tokens, README says 144.8 M", sum.Tokens)
	}
	inf := SimulateInfinite(reqs)
	if inf.HitBlocks != sum.BlockRefs-sum.DistinctBlocks {
		t.Errorf("infinite cache hits %d blocks, want every reference but the first: %d", inf.HitBlocks, sum.BlockRefs-sum.DistinctBlocks)
	}
	t.Logf("infinite cache: %.2f%% of block references", 100*inf.HitRate())

	capacity := sum.DistinctBlocks / 10
	results, err := Sweep(reqs, append(policy.Names(), OPT), []int{capacity})
	if err != nil {
		t.Fatal(err)
	}
	opt := results[len(results)-1]
	for _, r := range results {
		t.Logf("%-7s capacity %d blocks: hit rate %.2f%% (%.0f%% of OPT)", r.Policy, r.CapacityBlocks, 100*r.HitRate(), 100*r.HitRate()/opt.HitRate())
		if r.HitBlocks > opt.HitBlocks || opt.HitBlocks > inf.HitBlocks {
			t.Errorf("%s hits %d blocks; OPT %d and the infinite cache %d must bound it", r.Policy, r.HitBlocks, opt.HitBlocks, inf.HitBlocks)
		}
	}
	if *chartPath != "" {
		writeRealChart(t, reqs, sum, inf)
	}
}

func writeRealChart(t *testing.T, reqs []Request, sum Summary, inf Result) {
	var capacities []int
	for _, pct := range []float64{0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 50} {
		capacities = append(capacities, int(pct/100*float64(sum.DistinctBlocks)))
	}
	results, err := Sweep(reqs, append(policy.Names(), OPT), capacities)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(*chartPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	series := SeriesOf(append(results, inf), sum.DistinctBlocks)
	if err := WriteSVG(f, "Mooncake conversation trace: prefix hit rate by eviction policy", series...); err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		t.Logf("%-7s %6.2f%% capacity: %.2f%%", r.Policy, 100*float64(r.CapacityBlocks)/float64(sum.DistinctBlocks), 100*r.HitRate())
	}
}
