package index

import (
	"strings"
	"testing"
)

// TestEveryScorerIsSelectable builds every registered scorer by name and
// checks it scores the example index: pod A holds the prompt's first three
// blocks in GPU memory, so every scorer gives it a positive score, and a
// pod that holds nothing is scored 0.
func TestEveryScorerIsSelectable(t *testing.T) {
	ix := exampleIndex(t)
	names := ScorerNames()
	if len(names) != 4 || names[0] != ScorerLongestPrefix {
		t.Fatalf("ScorerNames() = %v, want the four scorers, longest-prefix first", names)
	}
	for _, name := range names {
		s, err := NewScorer(name)
		if err != nil {
			t.Fatalf("NewScorer(%q): %v", name, err)
		}
		got := asMap(t, s.Score(ix, prompt, []PodID{podA, podX}, nil))
		if got[podA] <= 0 || got[podX] != 0 {
			t.Errorf("%s: scores %v, want pod A above 0 and pod X at 0", name, got)
		}
	}
}

func TestNewScorerRejectsUnknownNames(t *testing.T) {
	for _, name := range []string{"", "random", "Longest-Prefix", "longest_prefix"} {
		s, err := NewScorer(name)
		if err == nil {
			t.Errorf("NewScorer(%q) = %T, want an error", name, s)
			continue
		}
		if !strings.Contains(err.Error(), strings.Join(ScorerNames(), ", ")) {
			t.Errorf("NewScorer(%q): %v, want the error to list the names", name, err)
		}
	}
}
