package tier

import (
	"errors"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
)

// keyedReserver is a RAM tier that can reserve for a known key, so that
// the key's owner's quota (Quota) applies before the bytes are written.
type keyedReserver interface {
	ReserveFor(key chunk.Key, size int) (arena.ID, []byte, error)
}

// quotaWait bounds how long a reservation refused by its owner's quota
// waits for the lower tiers' queued writes. A queued write holds its
// chunk in RAM, so an owner whose quota holds only chunks still on their
// way to disk would be refused though nothing of its is in use.
const quotaWait = 2 * time.Second

// reserveFor reserves RAM for key's chunk, within its owner's quota when
// the RAM tier keeps quotas. Called with m.mu read-locked.
func (m *Manager) reserveFor(key chunk.Key, size int) (arena.ID, []byte, error) {
	r, ok := m.ram.(keyedReserver)
	if !ok {
		return m.ram.Reserve(size)
	}
	id, buf, err := r.ReserveFor(key, size)
	if errors.Is(err, ErrQuota) && m.writesPending() {
		// Try again as writes finish, until one attempt fits, no write is
		// pending (the refusal is then final), quotaWait is spent or the
		// manager is closing (its Close waits for this read lock).
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		deadline := time.Now().Add(quotaWait)
		for errors.Is(err, ErrQuota) && m.writesPending() && time.Now().Before(deadline) && !m.stopping.Load() {
			<-tick.C
			id, buf, err = r.ReserveFor(key, size)
		}
	}
	CountQuotaRefusal(err)
	return id, buf, err
}

// quotaTrimmer is a RAM tier that can bring an owner back within its
// quota.
type quotaTrimmer interface {
	TrimQuota(key chunk.Key)
}

// trimQuota brings key's owner back within its RAM quota once a queued
// write released key's chunk: a commit past the quota (reservations of
// one batch are checked before any of them is charged) cannot evict
// chunks that queued writes still hold, so the writer finishes the job.
func (m *Manager) trimQuota(key chunk.Key) {
	if q, ok := m.ram.(quotaTrimmer); ok {
		q.TrimQuota(key)
	}
}

// writesPending reports whether any lower tier has writes queued.
func (m *Manager) writesPending() bool {
	for _, lt := range m.lower {
		if lt.pending.Load() > 0 {
			return true
		}
	}
	return false
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
