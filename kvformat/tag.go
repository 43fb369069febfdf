package kvformat

import (
	"fmt"
	"strconv"
	"strings"
)

// A format tag names a chunk format in one string, the way connectors pass
// it as the Format of their cache scope:
//
//	<dtype>/<layout>/<layers>x<kv_heads>x<head_dim>     e.g. bfloat16/KV_2LTD/32x8x128
//
// The chunk size is not part of it: it is the daemon's chunk_size. Tags of
// the shorter "<dtype>/<layout>" form still name a scope, but say too little
// to describe the bytes (ParseTag reports them as incomplete).

// Tag returns s's format tag, the form chunk.Scope's Format takes.
func (s Spec) Tag() string {
	return fmt.Sprintf("%s/%s/%dx%dx%d", s.DType, s.Layout, s.Layers, s.KVHeads, s.HeadDim)
}

// ParseTag reads a format tag into a Spec holding chunkTokens tokens per
// chunk. The spec it returns is valid.
func ParseTag(tag string, chunkTokens int) (Spec, error) {
	parts := strings.Split(tag, "/")
	if len(parts) != 3 {
		return Spec{}, fmt.Errorf("%w: format tag %.80q: want dtype/layout/LAYERSxKV_HEADSxHEAD_DIM", ErrSpec, tag)
	}
	dt, err := ParseDType(parts[0])
	if err != nil {
		return Spec{}, err
	}
	layout, err := ParseLayout(parts[1])
	if err != nil {
		return Spec{}, err
	}
	dims := strings.Split(strings.ToLower(parts[2]), "x")
	if len(dims) != 3 {
		return Spec{}, fmt.Errorf("%w: format tag %.80q: want LAYERSxKV_HEADSxHEAD_DIM after the layout", ErrSpec, tag)
	}
	var n [3]int
	for i, d := range dims {
		if n[i], err = strconv.Atoi(d); err != nil || n[i] <= 0 {
			return Spec{}, fmt.Errorf("%w: format tag %.80q: %q is not a positive number", ErrSpec, tag, d)
		}
	}
	s := Spec{Layers: n[0], KVHeads: n[1], HeadDim: n[2], DType: dt, Layout: layout, ChunkTokens: chunkTokens}
	if err := s.Validate(); err != nil {
		return Spec{}, err
	}
	return s, nil
}
