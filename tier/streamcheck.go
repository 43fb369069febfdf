package tier

import (
	"errors"
	"fmt"

	"kvtier/arena"
	"kvtier/chunk"
)

// A geometry a reader states (PREPARE_RETRIEVE_LAYERS) is a claim about
// bytes it did not write: a chunk that does not split into its spans was
// written with another one (another model's connector, a client's bug),
// and reading it by windows of the claimed spans would hand the reader
// bytes under the wrong layer's name. AcquireStreamExact therefore checks
// every chunk of the hit before its first read.

// ErrGeometry reports a layer geometry a reader stated that is refused:
// a chunk does not split into it (here), or the scope's format tag
// contradicts it (the engine).
var ErrGeometry = errors.New("stated layer geometry refused")

// Fits reports whether an n-byte chunk splits into g's Parts × Layers
// equal, non-empty spans.
func (g LayerGeometry) Fits(n int) bool {
	_, _, ok := g.Range(n, 0, 0)
	return ok
}

// GeometryError says which chunk (its index in the hit, -1 for none) of
// which size does not fit geo, wrapping ErrGeometry.
func GeometryError(geo LayerGeometry, chunk, size int) error {
	if chunk < 0 {
		return fmt.Errorf("%w: %s of %s is not a layer geometry", ErrGeometry, Plural(geo.Layers, "layer"), Plural(geo.Parts, "part"))
	}
	return fmt.Errorf("%w: chunk %d of the hit holds %d bytes, not a multiple of %s × %s", ErrGeometry, chunk, size, Plural(geo.Parts, "part"), Plural(geo.Layers, "layer"))
}

// Plural returns n and what, with an s unless n is 1: "1 part", "2 parts".
func Plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// hitChunk is where checkHit found a chunk of a hit after its leading
// RAM chunks: the lower tier holding it (-1 in RAM) and its size.
type hitChunk struct {
	tier, size int
}

// checkHit holds geo against every chunk of a hit before anything of it
// is reserved or read: the leading RAM chunks (held, ids), then the chunks
// after them, in RAM or on the first lower tier that holds them, up to
// the first that none holds. It looks at them without referencing,
// reading or counting them as accessed, and returns where it found each
// chunk after the leading ones, so that the acquire does not ask a tier
// again; or the error of the first chunk that does not split into geo.
func (m *Manager) checkHit(keys []chunk.Key, ids []arena.ID, geo LayerGeometry) ([]hitChunk, error) {
	for j, id := range ids {
		if size := m.arena.Size(id); !geo.Fits(size) {
			return nil, GeometryError(geo, j, size)
		}
	}
	n := len(ids)
	below := make([]hitChunk, 0, len(keys)-n)
	for i := n; i < len(keys); i++ {
		c := hitChunk{tier: -1}
		var ok bool
		if i > n {
			c.size, ok = m.ram.Size(keys[i])
		}
		if !ok {
			if c.tier = m.holder(keys[i], len(m.lower)); c.tier < 0 {
				break
			}
			if c.size, ok = m.lower[c.tier].Size(keys[i]); !ok {
				break
			}
		}
		if !geo.Fits(c.size) {
			return nil, GeometryError(geo, i, c.size)
		}
		below = append(below, c)
	}
	return below, nil
}

// undo gives back what a stream refused before its first read holds:
// the caller's reference on each chunk of the hit so far (held, RAM
// chunks and reservations alike) and the stream's own on each
// reservation, which frees it uncommitted.
func (s *Stream) undo(held []arena.ID) {
	for _, id := range held {
		s.m.arena.Unref(id)
	}
	for _, id := range s.ids {
		if id != 0 {
			s.m.arena.Unref(id)
		}
	}
}
