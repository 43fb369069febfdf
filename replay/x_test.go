package replay

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestX(t *testing.T) {
	pl := os.Getenv("KVX_P")
	if pl == "" {
		t.Skip()
	}
	names := strings.Split(pl, ",")
	pols := append(append([]string(nil), names...), OPT)
	traces := []struct {
		name string
		reqs []Request
	}{{"conversation", readRealTrace(t)}}
	for _, k := range SynthKinds() {
		if k == "system" {
			continue
		}
		reqs, _ := Synthesize(k, 1, 12000)
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
		res, _ := Sweep(tr.reqs, pols, caps)
		for ci := range caps {
			opt := res[len(names)*len(caps)+ci].HitRate()
			var b strings.Builder
			fmt.Fprintf(&b, "%-12s %3.0f%%", tr.name, 100*fracs[ci])
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
	b.WriteString("mean9:")
	for pi, name := range names {
		fmt.Fprintf(&b, "  %s %.3f", name, sums[pi]/float64(rows))
	}
	t.Log(b.String())
}
