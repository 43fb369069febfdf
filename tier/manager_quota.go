package tier

import (
	"kvtier/arena"
	"kvtier/chunk"
)

// keyedReserver is a RAM tier that can reserve for a known key, so that
// the key's owner's quota (Quota) applies before the bytes are written.
type keyedReserver interface {
	ReserveFor(key chunk.Key, size int) (arena.ID, []byte, error)
}

// reserveFor reserves RAM for key's chunk, within its owner's quota when
// the RAM tier keeps quotas.
func (m *Manager) reserveFor(key chunk.Key, size int) (arena.ID, []byte, error) {
	if r, ok := m.ram.(keyedReserver); ok {
		return r.ReserveFor(key, size)
	}
	return m.ram.Reserve(size)
}

// ReserveFor is Reserve for a chunk to be committed under key: when key's
// owner is at its RAM quota, the owner's own chunks are evicted to make
// room, and the reservation fails with ErrQuota when they are all in use.
func (m *Manager) ReserveFor(key chunk.Key, size int) (arena.ID, []byte, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return 0, nil, ErrClosed
	}
	return m.reserveFor(key, size)
}
