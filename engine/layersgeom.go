package engine

import (
	"fmt"

	"kvtier/chunk"
	"kvtier/tier"
)

// A layer geometry stated by a PREPARE_RETRIEVE_LAYERS is checked before
// anything is read (docs/protocol.md): against what the format tag of
// every scope of the keys says of the chunks (their layout, their layer
// count), and against every chunk's size (tier.Manager.AcquireStreamExact
// and the slots of a RAM hit), so that no chunk written with another
// geometry is read by windows of this one. A per-layer save (STORE_LAYER)
// holds its geometry against the same tags, since one that differs from
// the chunks' real layout would put on disk a record whose bytes differ
// from the RAM copy.

// ErrGeometry reports a stated layer geometry that the scope's format tag
// or a chunk of the hit contradicts; the request is refused whole.
var ErrGeometry = tier.ErrGeometry

// Scoped names the scope every key of a request is of, as the connection
// that sent it registered the scope: its geometry is then held against
// that scope's format tag even when the engine's registry has forgotten
// the scope. Without it (raw keys), each distinct scope of the keys is
// looked up.
type Scoped struct {
	Format string // the scope's format tag
	Known  bool   // every key is of the one scope whose tag is Format
}

// tagConflict is why a scope's format tag contradicts a geometry.
type tagConflict uint8

const (
	tagAgrees      tagConflict = iota
	tagInterleaves             // the layout interleaves layers with tokens
	tagParts                   // the layout has another number of parts per layer
	tagLayers                  // the tag has another layer count
)

// conflict returns why t contradicts g, tagAgrees when it does not.
func (t scopeTag) conflict(g tier.LayerGeometry) tagConflict {
	want := t.parts()
	switch {
	case want == 0:
		return tagInterleaves
	case g.Parts != want:
		return tagParts
	case t.spec.Layers > 0 && t.spec.Layers != g.Layers:
		return tagLayers
	}
	return tagAgrees
}

// tagOf returns what the format tag of scope id says: the engine's
// cache, or for a scope it does not know, sc's format when sc says every
// key is of that scope (parsed, not cached: a caller's word for scope id
// is not the engine's).
func (e *Engine) tagOf(id uint64, sc Scoped) (scopeTag, bool) {
	if t, ok := e.specs.tag(id); ok {
		return t, true
	}
	if !sc.Known {
		return scopeTag{}, false
	}
	return parseScopeTag(sc.Format, e.chunkSize)
}

// firstConflict holds g against the format tag of every distinct scope of
// keys and returns the first that contradicts it, with why; tagAgrees
// when none does (a scope without a known tag has nothing to hold g
// against). It allocates nothing.
func (e *Engine) firstConflict(keys []chunk.Key, g tier.LayerGeometry, sc Scoped) (scopeTag, tagConflict) {
	for i, k := range keys {
		if i > 0 && (sc.Known || k.Scope == keys[i-1].Scope) {
			continue // looked at already
		}
		if t, ok := e.tagOf(k.Scope, sc); ok {
			if c := t.conflict(g); c != tagAgrees {
				return t, c
			}
		}
	}
	return scopeTag{}, tagAgrees
}

// checkStated returns an error wrapping ErrGeometry when the format tag of
// a scope of keys contradicts g: a layout that interleaves layers with
// tokens (no layer is a span), a layout with another number of parts per
// layer, or another layer count.
func (e *Engine) checkStated(keys []chunk.Key, g tier.LayerGeometry, sc Scoped) error {
	t, c := e.firstConflict(keys, g, sc)
	switch c {
	case tagInterleaves:
		return fmt.Errorf("%w: the scope's layout %v interleaves layers with tokens", ErrGeometry, t.layout)
	case tagParts:
		return fmt.Errorf("%w: %s per layer; the scope's layout %v has %s", ErrGeometry, tier.Plural(g.Parts, "part"), t.layout, tier.Plural(t.parts(), "part"))
	case tagLayers:
		return fmt.Errorf("%w: %s; the scope's format tag says %d", ErrGeometry, tier.Plural(g.Layers, "layer"), t.spec.Layers)
	}
	return nil
}

// misfitPending returns an error wrapping ErrGeometry for the first of
// the leading pending keys whose reservation does not split into geo, nil
// when all do; at is the index of keys[0] in the hit. Called with
// e.pend.mu held, before anything is taken, so that a refusal leaves no
// reader counted on a push.
func (e *Engine) misfitPending(keys []chunk.Key, at int, geo tier.LayerGeometry) error {
	a := e.arenaOf()
	for j, k := range keys {
		p, ok := e.pend.m[k]
		if !ok {
			return nil
		}
		if size := a.Size(p.id); size >= 0 && !geo.Fits(size) {
			return fmt.Errorf("%w: chunk %d of the hit, still arriving, holds %d bytes, not a multiple of %s × %s",
				ErrGeometry, at+j, size, tier.Plural(geo.Parts, "part"), tier.Plural(geo.Layers, "layer"))
		}
	}
	return nil
}
