package replay

import (
	"testing"

	"kvtier/tier/policy"
)

// TestPrefixPoliciesOnRealTrace pins the prefix-aware policies' hit rates
// on the shared conversation trace, as fractions of OPT at 10 % of its
// distinct blocks (docs/bench.md, "Eviction policies"; the other
// capacities would take over a minute under the race detector). Hit rates
// are deterministic, so these are floors a little under the measured
// figures: a change that loses ground fails here.
func TestPrefixPoliciesOnRealTrace(t *testing.T) {
	tr := compile(readRealTrace(t))
	floors := []struct {
		pct             float64
		treelfu, treehd float64 // measured 0.804, 0.696 (neighbour-run sampling)
	}{{10, 0.80, 0.69}}
	for _, f := range floors {
		capacity := int(f.pct / 100 * float64(tr.blocks))
		opt, _ := tr.run(OPT, capacity)
		for _, c := range []struct {
			name  string
			floor float64
		}{{policy.TREELFU, f.treelfu}, {policy.TREEHD, f.treehd}} {
			r, err := tr.run(c.name, capacity)
			if err != nil {
				t.Fatal(err)
			}
			ratio := r.HitRate() / opt.HitRate()
			t.Logf("%s at %.0f %%: %.3f of OPT", c.name, f.pct, ratio)
			if ratio < c.floor || r.HitRate() > opt.HitRate() {
				t.Errorf("%s at %.0f %%: hit rate %.4f = %.3f of OPT (%.4f), want at least %.2f and at most 1",
					c.name, f.pct, r.HitRate(), ratio, opt.HitRate(), c.floor)
			}
		}
	}
}

// TestSynthesizeIsDeterministic: the same kind, seed and length give the
// same trace, another seed another one, and every trace is valid and
// prefix-chained (a block id always follows the same parent).
func TestSynthesizeIsDeterministic(t *testing.T) {
	for _, kind := range SynthKinds() {
		a, err := Synthesize(kind, 7, 500)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := Synthesize(kind, 7, 500)
		c, _ := Synthesize(kind, 8, 500)
		same, differs := true, false
		parent := map[uint64]int64{}
		for i := range a {
			if err := a[i].validate(); err != nil {
				t.Fatalf("%s request %d: %v", kind, i, err)
			}
			same = same && equalIDs(a[i].HashIDs, b[i].HashIDs) && a[i].InputLength == b[i].InputLength
			differs = differs || !equalIDs(a[i].HashIDs, c[i].HashIDs)
			for j, id := range a[i].HashIDs {
				p := int64(-1)
				if j > 0 {
					p = int64(a[i].HashIDs[j-1])
				}
				if q, ok := parent[id]; ok && q != p {
					t.Fatalf("%s: block %d follows %d and %d", kind, id, q, p)
				}
				parent[id] = p
			}
		}
		if !same || !differs {
			t.Errorf("%s: same seed gives the same trace: %v; another seed a different one: %v", kind, same, differs)
		}
	}
	if _, err := Synthesize("nope", 1, 10); err == nil {
		t.Error("an unknown kind was accepted")
	}
}

func equalIDs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
