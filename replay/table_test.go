package replay

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"kvtier/tier/policy"
)

// TestPolicyTable prints the policy table of docs/bench.md ("Eviction
// policies"): every policy's simulated block hit rate as a fraction of
// OPT's, RAM only, on the shared conversation trace and the synthetic
// ones at 2, 5 and 10 %, and each policy's mean over the rows. It takes
// tens of seconds, so it runs only when asked:
//
//	KVTIER_POLICY_TABLE=1 go test -run TestPolicyTable -v ./replay
func TestPolicyTable(t *testing.T) {
	if os.Getenv("KVTIER_POLICY_TABLE") == "" {
		t.Skip("set KVTIER_POLICY_TABLE=1 to print the table")
	}
	names := policy.Names()
	pols := append(append([]string(nil), names...), OPT)
	traces := []struct {
		name string
		reqs []Request
	}{{"conversation", readRealTrace(t)}}
	for _, k := range SynthKinds() {
		reqs, err := Synthesize(k, 1, 12000)
		if err != nil {
			t.Fatal(err)
		}
		traces = append(traces, struct {
			name string
			reqs []Request
		}{k, reqs})
	}
	fracs := []float64{0.02, 0.05, 0.10}
	sums := make([]float64, len(names))
	rows := 0
	for _, tr := range traces {
		blocks := Summarize(tr.reqs).DistinctBlocks
		caps := make([]int, len(fracs))
		for i, f := range fracs {
			caps[i] = max(1, int(f*float64(blocks)))
		}
		res, err := Sweep(tr.reqs, pols, caps)
		if err != nil {
			t.Fatal(err)
		}
		for ci := range caps {
			opt := res[len(names)*len(caps)+ci].HitRate()
			var b strings.Builder
			fmt.Fprintf(&b, "%-12s %3.0f%%  OPT %5.1f%%", tr.name, 100*fracs[ci], 100*opt)
			for pi, name := range names {
				r := res[pi*len(caps)+ci].HitRate() / opt
				sums[pi] += r
				fmt.Fprintf(&b, "  %s %.3f", name, r)
			}
			rows++
			t.Log(b.String())
		}
	}
	var b strings.Builder
	b.WriteString("mean over the rows:")
	for pi, name := range names {
		fmt.Fprintf(&b, "  %s %.3f", name, sums[pi]/float64(rows))
	}
	t.Log(b.String())
}
