package config

import (
	"fmt"
	"math"
	"strings"
)

// CacheBlend's settings (docs/blend.md) are read by the engine-side blender,
// not the daemon, but a file that sets them is checked when it loads: a
// recompute ratio of 1.5 or a blank marker is a mistake whichever process
// reads it, and reporting it here names the file and line.

func checked(k lmcacheKey, valid func(any) error) lmcacheKey {
	k.Valid = valid
	return k
}

// validBlendRatios: each ratio is the share of reused tokens recomputed.
func validBlendRatios(v any) error {
	list, _ := v.([]float64)
	for _, r := range list {
		if math.IsNaN(r) || r < 0 || r > 1 {
			return fmt.Errorf("recompute ratio %s is outside [0, 1] (a share of the reused tokens)", showFloat(r))
		}
	}
	return nil
}

// validBlendThresholds: token selection by threshold is not implemented
// (by LMCache either); an empty list or null is accepted.
func validBlendThresholds(v any) error {
	if list, _ := v.([]float64); len(list) > 0 {
		return fmt.Errorf("%w: tokens are selected by blend_recompute_ratios; leave blend_thresholds unset", ErrUnsupported)
	}
	return nil
}

// validBlendLayers: check layers are layer indices.
func validBlendLayers(v any) error {
	list, _ := v.([]int64)
	for _, l := range list {
		if l < 0 {
			return fmt.Errorf("check layer %d is not a layer index", l)
		}
	}
	return nil
}

func validBlendMinTokens(v any) error {
	if n, _ := v.(int64); n < 0 {
		return fmt.Errorf("want 0 or more tokens, got %d", n)
	}
	return nil
}

// validBlendMarker: the marker separates segments; a blank one would match
// every space or nothing.
func validBlendMarker(v any) error {
	if s, _ := v.(string); strings.TrimSpace(s) == "" {
		return fmt.Errorf("want a non-blank separator such as %q, got %q", " # # ", v)
	}
	return nil
}
