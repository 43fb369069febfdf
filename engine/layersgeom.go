package engine

import (
	"fmt"
	"strings"

	"kvtier/chunk"
	"kvtier/kvformat"
	"kvtier/tier"
)

// A layer geometry stated by a PREPARE_RETRIEVE_LAYERS is checked before
// anything is read (docs/protocol.md): against what the scope's format
// tag says of the chunks (their layout, their layer count), and against
// every chunk's size (tier.Manager.AcquireStreamExact), so that no chunk
// written with another geometry is read by windows of this one.

// ErrGeometry reports a stated layer geometry that the scope's format tag
// or a chunk of the hit contradicts; the request is refused whole.
var ErrGeometry = tier.ErrGeometry

// checkStated returns an error wrapping ErrGeometry when keys' scope's
// format tag contradicts g: a layout that interleaves layers with tokens
// (no layer is a span), a layout with another number of parts per layer,
// or another layer count.
func (e *Engine) checkStated(keys []chunk.Key, g tier.LayerGeometry) error {
	if len(keys) == 0 {
		return nil
	}
	sc, ok := e.book.lookup(keys[0].Scope)
	if !ok {
		return nil
	}
	layout, ok := tagLayout(sc.Format)
	if !ok {
		return nil // no tag, or not one we read: nothing to hold g against
	}
	want := 0
	switch layout {
	case kvformat.Layout2LTD:
		want = 2
	case kvformat.LayoutMLA:
		want = 1
	}
	if want == 0 {
		return fmt.Errorf("%w: the scope's layout %v interleaves layers with tokens", ErrGeometry, layout)
	}
	if g.Parts != want {
		return fmt.Errorf("%w: %d parts per layer; the scope's layout %v has %d", ErrGeometry, g.Parts, layout, want)
	}
	if layers := e.tagLayers(keys[0].Scope, sc.Format); layers > 0 && layers != g.Layers {
		return fmt.Errorf("%w: %d layers; the scope's format tag says %d", ErrGeometry, g.Layers, layers)
	}
	return nil
}

// tagLayers returns the layer count of scope id's format tag, 0 when it
// has none. The spec cache answers without allocating; a tag of the short
// dtype/layout form is not parsed at all, since it has no count.
func (e *Engine) tagLayers(id uint64, format string) int {
	if e.specs != nil {
		if spec := e.specs.get(id); spec.Layers > 0 {
			return spec.Layers
		}
	}
	if strings.Count(format, "/") != 2 {
		return 0
	}
	spec, err := kvformat.ParseTag(format, e.chunkSize)
	if err != nil {
		return 0
	}
	return spec.Layers
}

// tagLayout returns the layout a format tag names in its second field
// (dtype/layout[/dims]), and false when it names none.
func tagLayout(format string) (kvformat.Layout, bool) {
	_, rest, ok := strings.Cut(format, "/")
	if !ok {
		return 0, false
	}
	name, _, _ := strings.Cut(rest, "/")
	l, err := kvformat.ParseLayout(name)
	return l, err == nil
}

// misfitPending returns an error wrapping ErrGeometry for the first of
// the leading pending keys whose reservation does not split into geo, nil
// when all do. Called with e.pend.mu held, before anything is taken, so
// that a refusal leaves no reader counted on a push.
func (e *Engine) misfitPending(keys []chunk.Key, geo tier.LayerGeometry) error {
	a := e.arenaOf()
	for j, k := range keys {
		p, ok := e.pend.m[k]
		if !ok {
			return nil
		}
		if size := a.Size(p.id); size >= 0 && !geo.Fits(size) {
			return fmt.Errorf("%w: pending chunk %d of %d bytes, not a multiple of %d parts × %d layers", ErrGeometry, j, size, geo.Parts, geo.Layers)
		}
	}
	return nil
}
