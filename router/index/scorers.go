package index

import (
	"fmt"
	"strings"
)

// Scorer names, as ScorerNames lists them and NewScorer accepts. They are
// what an operator writes (a flag, a configuration key), so they are
// stable: renaming one breaks configurations.
const (
	ScorerLongestPrefix = "longest-prefix"
	ScorerTierWeighted  = "tier-weighted"
	ScorerBlockHits     = "block-hits"
	ScorerCoverage      = "coverage"
)

// scorers is the one list of the scorers this package builds, default
// first. Flags, configuration validation and documentation ask
// ScorerNames rather than keep their own copy, so a scorer added here is
// selectable everywhere at once.
var scorers = []struct {
	name string
	new  func() Scorer
}{
	{ScorerLongestPrefix, func() Scorer { return LongestPrefix{} }},
	{ScorerTierWeighted, func() Scorer { return TierWeightedPrefix{Weights: DefaultTierWeights()} }},
	{ScorerBlockHits, func() Scorer { return BlockHits{} }},
	{ScorerCoverage, func() Scorer { return Coverage{} }},
}

// ScorerNames lists the names NewScorer accepts, default first.
func ScorerNames() []string {
	names := make([]string, len(scorers))
	for i, s := range scorers {
		names[i] = s.name
	}
	return names
}

// NewScorer returns the scorer registered under name; tier-weighted uses
// DefaultTierWeights.
func NewScorer(name string) (Scorer, error) {
	for _, s := range scorers {
		if s.name == name {
			return s.new(), nil
		}
	}
	return nil, fmt.Errorf("unknown scorer %q (want one of %s)", name, strings.Join(ScorerNames(), ", "))
}
