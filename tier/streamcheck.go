package tier

import (
	"errors"
	"fmt"

	"kvtier/arena"
)

// A geometry a reader states (PREPARE_RETRIEVE_LAYERS) is a claim about
// bytes it did not write: a chunk that does not split into its spans was
// written with another one (another model's connector, a client's bug),
// and reading it by windows of the claimed spans would hand the reader
// bytes under the wrong layer's name. AcquireStreamExact therefore checks
// every chunk of the hit before its first read.

// ErrGeometry reports a chunk that does not split into the layer
// geometry a reader stated.
var ErrGeometry = errors.New("chunk does not split into the stated layer geometry")

// Fits reports whether an n-byte chunk splits into g's Parts × Layers
// equal, non-empty spans.
func (g LayerGeometry) Fits(n int) bool {
	_, _, ok := g.Range(n, 0, 0)
	return ok
}

// geometryError says which chunk (its index in the hit, -1 for none) of
// which size does not fit geo, wrapping ErrGeometry.
func geometryError(geo LayerGeometry, chunk, size int) error {
	if chunk < 0 {
		return fmt.Errorf("%w: %d layers of %d parts (want 1 to %d layers of 1 or 2 parts)", ErrGeometry, geo.Layers, geo.Parts, MaxLayers)
	}
	return fmt.Errorf("%w: chunk %d of the hit holds %d bytes, not a multiple of %d parts × %d layers", ErrGeometry, chunk, size, geo.Parts, geo.Layers)
}

// refuseMisfits drops the references ids hold (the RAM chunks leading a
// hit) and returns the error of the first that does not fit geo, or
// returns nil and keeps them when all fit.
func (m *Manager) refuseMisfits(ids []arena.ID, geo LayerGeometry) error {
	for j, id := range ids {
		if size := m.arena.Size(id); !geo.Fits(size) {
			for _, id := range ids {
				m.arena.Unref(id)
			}
			return geometryError(geo, j, size)
		}
	}
	return nil
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
