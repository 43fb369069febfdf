package index

import (
	"errors"
	"math"
	"testing"
)

// Pods in the hand-worked example, and which of blocks 1..5 each holds:
//
//	block:  1        2       3     4     5
//	A       GPU      GPU     GPU
//	B       CPU      Disk          GPU   GPU
//	C                GPU     GPU   GPU   GPU
//	D       GPU+CPU  Remote
const (
	podA PodID = 1
	podB PodID = 2
	podC PodID = 3
	podD PodID = 4
	podX PodID = 9 // never added
)

var prompt = []uint64{1, 2, 3, 4, 5}

func exampleIndex(t *testing.T) *Index {
	ix := newIndex(t, 1000, 4)
	mustAdd(t, ix, podA, GPU, 1, 2, 3)
	mustAdd(t, ix, podB, CPU, 1)
	mustAdd(t, ix, podB, Disk, 2)
	mustAdd(t, ix, podB, GPU, 4, 5)
	mustAdd(t, ix, podC, GPU, 2, 3, 4, 5)
	mustAdd(t, ix, podD, GPU, 1)
	mustAdd(t, ix, podD, CPU, 1)
	mustAdd(t, ix, podD, Remote, 2)
	return ix
}

func asMap(t *testing.T, got []PodScore) map[PodID]float64 {
	t.Helper()
	m := map[PodID]float64{}
	for _, s := range got {
		if _, dup := m[s.Pod]; dup {
			t.Errorf("pod %d scored twice", s.Pod)
		}
		m[s.Pod] = s.Score
	}
	return m
}

func sameScores(t *testing.T, name string, got []PodScore, want map[PodID]float64) {
	t.Helper()
	m := asMap(t, got)
	if len(m) != len(want) {
		t.Errorf("%s: scored %v, want %v", name, m, want)
		return
	}
	for p, w := range want {
		if g, ok := m[p]; !ok || math.Abs(g-w) > 1e-9 {
			t.Errorf("%s: pod %d scored %v (present %v), want %v", name, p, g, ok, w)
		}
	}
}

func TestScorersAllPods(t *testing.T) {
	ix := exampleIndex(t)
	cases := []struct {
		name   string
		scorer Scorer
		want   map[PodID]float64
	}{
		{"LongestPrefix", LongestPrefix{}, map[PodID]float64{podA: 3, podB: 2, podD: 2}},
		{"BlockHits", BlockHits{}, map[PodID]float64{podA: 3, podB: 4, podC: 4, podD: 2}},
		{"Coverage", Coverage{}, map[PodID]float64{podA: 0.6, podB: 0.8, podC: 0.8, podD: 0.4}},
		// A: 1+1+1; B: CPU 0.8 + Disk 0.5; D: best of GPU/CPU 1.0 + Remote 0.3.
		{"TierWeightedPrefix", TierWeightedPrefix{DefaultTierWeights()}, map[PodID]float64{podA: 3, podB: 1.3, podD: 1.3}},
	}
	for _, c := range cases {
		sameScores(t, c.name, c.scorer.Score(ix, prompt, nil, nil), c.want)
	}
}

func TestScorersWithCandidates(t *testing.T) {
	ix := exampleIndex(t)
	cands := []PodID{podC, podA, podX, podA} // duplicate A is scored once
	cases := []struct {
		name   string
		scorer Scorer
		want   []PodScore
	}{
		{"LongestPrefix", LongestPrefix{}, []PodScore{{podC, 0}, {podA, 3}, {podX, 0}}},
		{"BlockHits", BlockHits{}, []PodScore{{podC, 4}, {podA, 3}, {podX, 0}}},
		{"Coverage", Coverage{}, []PodScore{{podC, 0.8}, {podA, 0.6}, {podX, 0}}},
		{"TierWeightedPrefix", TierWeightedPrefix{DefaultTierWeights()}, []PodScore{{podC, 0}, {podA, 3}, {podX, 0}}},
	}
	for _, c := range cases {
		prefix := []PodScore{{77, 42}} // dst content is kept
		got := c.scorer.Score(ix, prompt, cands, prefix)
		want := append([]PodScore{{77, 42}}, c.want...)
		if len(got) != len(want) {
			t.Errorf("%s: %v, want %v", c.name, got, want)
			continue
		}
		for i := range want {
			if got[i].Pod != want[i].Pod || math.Abs(got[i].Score-want[i].Score) > 1e-9 {
				t.Errorf("%s: %v, want %v", c.name, got, want)
				break
			}
		}
	}
	if got := (LongestPrefix{}).Score(ix, prompt, []PodID{}, nil); len(got) != 0 {
		t.Errorf("empty candidate set scored %v", got)
	}
	if got := (Coverage{}).Score(ix, nil, []PodID{podA}, nil); len(got) != 1 || got[0].Score != 0 {
		t.Errorf("coverage of empty prompt: %v", got)
	}
}

func TestTierWeightsPickBestTier(t *testing.T) {
	ix := newIndex(t, 100, 1)
	mustAdd(t, ix, 1, Remote, 1, 2)
	mustAdd(t, ix, 1, Disk, 2)
	w := [NumTiers]float64{GPU: 0.1, CPU: 0.2, Disk: 0.9, Remote: 0.4}
	got := TierWeightedPrefix{w}.Score(ix, []uint64{1, 2}, nil, nil)
	sameScores(t, "weights", got, map[PodID]float64{1: 0.4 + 0.9})
}

func TestLongestPrefixStopsEarly(t *testing.T) {
	ix := exampleIndex(t)
	long := append(append([]uint64{}, prompt...), 6, 7, 8)
	mustAdd(t, ix, podC, GPU, 6, 7, 8)
	// A's prefix (3) is the longest; block 4 is the first nobody continues.
	if _, walked := score(ix, long, nil, nil, modePrefix, &unitWeights); walked != 4 {
		t.Errorf("walked %d blocks, want 4", walked)
	}
	// C holds no first block: nothing to walk past block 1.
	if _, walked := score(ix, long, []PodID{podC}, nil, modePrefix, &unitWeights); walked != 1 {
		t.Errorf("walked %d blocks with candidate C, want 1", walked)
	}
	// Hit counting reads everything.
	if _, walked := score(ix, long, nil, nil, modeHits, &unitWeights); walked != len(long) {
		t.Errorf("hits walked %d blocks, want %d", walked, len(long))
	}
}

func TestScoreDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	ix, hashes, _ := fullPrefixIndex(t, 8, 128)
	dst := make([]PodScore, 0, 16)
	allocs := testing.AllocsPerRun(100, func() {
		dst = LongestPrefix{}.Score(ix, hashes, nil, dst[:0])
	})
	if allocs != 0 {
		t.Errorf("LongestPrefix.Score: %v allocs per run", allocs)
	}
	if len(dst) != 8 || dst[0].Score != 128 {
		t.Errorf("scores %v, want 8 pods at 128", dst)
	}
}

// fullPrefixIndex returns an index where pods 0..pods-1 all hold the same
// blocks-long prompt in GPU, and the prompt.
func fullPrefixIndex(t testing.TB, pods, blocks int) (*Index, []uint64, []PodID) {
	ix := newIndex(t, 1<<16, 0)
	hashes := make([]uint64, blocks)
	for i := range hashes {
		hashes[i] = uint64(i)*0x9e3779b97f4a7c15 + 12345
	}
	ids := make([]PodID, pods)
	for p := range ids {
		ids[p] = PodID(p)
		mustAdd(t, ix, PodID(p), GPU, hashes...)
	}
	return ix, hashes, ids
}

func TestPods(t *testing.T) {
	ps := NewPods()
	a, err := ps.Intern("pod-a")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ps.Intern("pod-b")
	if a2, _ := ps.Intern("pod-a"); a2 != a || a == b {
		t.Fatalf("ids a=%d a2=%d b=%d", a, a2, b)
	}
	if n, ok := ps.Name(b); !ok || n != "pod-b" {
		t.Errorf("Name(%d) = %q %v", b, n, ok)
	}
	if id, ok := ps.Remove("pod-a"); !ok || id != a {
		t.Errorf("Remove = %d %v", id, ok)
	}
	if _, ok := ps.ID("pod-a"); ok {
		t.Error("removed pod still registered")
	}
	if _, ok := ps.Name(a); ok {
		t.Error("removed id still named")
	}
	if _, ok := ps.Remove("pod-a"); ok {
		t.Error("second Remove succeeded")
	}
	c, _ := ps.Intern("pod-c")
	if c != a {
		t.Errorf("freed id %d not reused (got %d)", a, c)
	}
	if ps.Len() != 2 {
		t.Errorf("Len %d, want 2", ps.Len())
	}
	if _, err := ps.Intern(""); !errors.Is(err, ErrEmptyPodName) {
		t.Errorf("Intern(\"\"): %v", err)
	}
}

// wordsOnly is a Store that offers scorers nothing but HolderWords, as an
// external index would; scores must equal the in-memory index's.
type wordsOnly struct{ *Index }

func (w wordsOnly) HolderWords(h uint64, dst []uint32) []uint32 { return w.Index.HolderWords(h, dst) }

func TestScorersOverAnyStore(t *testing.T) {
	ix := exampleIndex(t)
	for _, sc := range []Scorer{LongestPrefix{}, BlockHits{}, Coverage{}, TierWeightedPrefix{Weights: DefaultTierWeights()}} {
		want := sc.Score(ix, prompt, nil, nil)
		got := sc.Score(wordsOnly{ix}, prompt, nil, nil)
		if len(want) == 0 || len(got) != len(want) {
			t.Fatalf("%T: %v vs %v", sc, got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%T: %v vs %v", sc, got, want)
			}
		}
	}
}
