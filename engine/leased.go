package engine

import (
	"context"
	"errors"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
)

// The zero-copy operations of the local protocol, on chunk keys: they
// hand out slots of the shared arena under a lease (see leaseTable).

// Slot is where one chunk's bytes are in the shared arena: Offset from the
// arena's start and Len bytes. Stored marks a chunk a store found already
// cached, which has no slot to fill.
type Slot struct {
	Offset uint64
	Len    uint32
	Stored bool
}

// LeaseTTL applies the lease rule to a requested duration (0: none asked).
func (e *Engine) LeaseTTL(asked time.Duration) time.Duration { return e.leases.ttl(asked) }

// PinHit keeps the chunks of a lookup's hit resident until the returned
// lease ends: RAM chunks by arena references under the lease, lower-tier
// chunks by the tiers' own pins, which lapse after the lease's TTL by
// themselves. It returns 0 only when the engine is closed.
func (e *Engine) PinHit(keys []chunk.Key, ttl time.Duration) LeaseID {
	ttl = e.leases.ttl(ttl)
	i, l := e.leases.build(leaseLookup)
	for j := range keys {
		// Acquire into the lease's own slice: a local array would escape
		// through the interface call and cost an allocation per hit.
		l.ids = append(l.ids, 0)
		if e.mgr.RAM().Acquire(keys[j:j+1], l.ids[len(l.ids)-1:]) == 1 {
			continue
		}
		l.ids = l.ids[:len(l.ids)-1]
		for _, t := range e.mgr.Tiers()[1:] {
			if tier.Pin(t, keys[j:j+1], ttl) == 1 {
				break
			}
		}
	}
	return e.leases.activate(i, ttl)
}

// PrepareStore reserves an arena slot for each chunk keys[j] of sizes[j]
// bytes, appending them to slots, for a client to fill in place and then
// CommitStore. A chunk already in RAM gets a Stored slot. The slots stop
// at the first chunk the arena has no room for: a shorter store, not an
// error. The lease is 0 when there is nothing to hold.
func (e *Engine) PrepareStore(keys []chunk.Key, sizes []uint32, ttl time.Duration, slots []Slot) ([]Slot, LeaseID, error) {
	i, l := e.leases.build(leaseStore)
	for j, size := range sizes {
		if e.mgr.RAM().Contains(keys[j]) {
			l.keys, l.ids = append(l.keys, keys[j]), append(l.ids, 0)
			slots = append(slots, Slot{Stored: true, Len: size})
			continue
		}
		id, _, err := e.mgr.ReserveFor(keys[j], int(size))
		if err != nil {
			if errors.Is(err, arena.ErrNoSpace) || errors.Is(err, tier.ErrTooLarge) || errors.Is(err, tier.ErrQuota) {
				break // the prefix the client may store ends here
			}
			e.leases.discard(i)
			return slots, 0, err
		}
		l.keys, l.ids = append(l.keys, keys[j]), append(l.ids, id)
		slots = append(slots, Slot{Offset: uint64(e.arenaOf().Offset(id)), Len: size})
	}
	if len(l.keys) == 0 {
		e.leases.discard(i)
		return slots, 0, nil
	}
	return slots, e.leases.activate(i, e.leases.ttl(ttl)), nil
}

// CommitStore ends store lease id, making its first count chunks visible
// (the client filled them) and returning the rest of its reservations. It
// returns how many chunks the lease covered, at most count. A lease of
// another kind is ended as well, with ErrNotStoreLease.
func (e *Engine) CommitStore(id LeaseID, count int) (int, error) {
	i, l, ok := e.leases.take(id)
	if !ok {
		return 0, ErrUnknownLease
	}
	defer e.leases.discard(i) // returns the reservations past count
	if l.kind != leaseStore {
		return 0, ErrNotStoreLease
	}
	n := min(count, len(l.keys))
	// The lease's keys are consecutive chunks of the prompt; those stored
	// already have no reservation (id 0), which CommitRun skips while
	// still naming each chunk's parent to the tiers.
	save := l.save
	l.save = nil // the commit ends it, not the lease's discard
	err := e.mgr.CommitRunSaved(l.keys[:n], l.ids[:n], save)
	for j := range n {
		l.ids[j] = 0 // Commit consumed these references
	}
	if err != nil {
		return 0, err
	}
	if l.feed != nil { // its pushes may send every layer of the first n
		l.feed.end(n)
		l.feed = nil
	}
	return n, nil
}

// PrepareRetrieve references the leading cached chunks of keys in RAM,
// promoting lower-tier hits, and appends their slots, for a client to read
// in place until the returned lease ends (0 when no chunk was cached). A
// tier failing after some chunks ends the prefix there without an error.
func (e *Engine) PrepareRetrieve(ctx context.Context, keys []chunk.Key, ttl time.Duration, slots []Slot) ([]Slot, LeaseID, error) {
	i, l := e.leases.build(leaseRetrieve)
	l.ids = growIDs(l.ids, len(keys))
	n, err := e.mgr.Acquire(ctx, keys, l.ids)
	l.ids = l.ids[:n]
	if err != nil && n == 0 {
		e.leases.discard(i)
		return slots, 0, err
	}
	a := e.arenaOf()
	for _, id := range l.ids {
		slots = append(slots, Slot{Offset: uint64(a.Offset(id)), Len: uint32(a.Size(id))})
	}
	if n == 0 {
		e.leases.discard(i)
		return slots, 0, nil
	}
	return slots, e.leases.activate(i, e.leases.ttl(ttl)), nil
}

// Release ends lease id and reports whether it was active.
func (e *Engine) Release(id LeaseID) bool { return e.leases.release(id) }

// Renew moves lease id's deadline to ttl from now (the lease rule applies)
// and reports whether the lease was active.
func (e *Engine) Renew(id LeaseID, ttl time.Duration) bool {
	return e.leases.renew(id, e.leases.ttl(ttl))
}

// LeaseActive reports whether lease id has not ended.
func (e *Engine) LeaseActive(id LeaseID) bool { return e.leases.active(id) }

// LeasesExpired returns how many leases ended at their deadline, never
// released: their memory was reclaimed by the reaper.
func (e *Engine) LeasesExpired() uint64 { return e.leases.expired.Load() }

// ExpireLeases ends the leases whose deadline is at or before now, as the
// reaper does every quarter second; for tests that cannot wait.
func (e *Engine) ExpireLeases(now time.Time) int { return e.leases.expire(now) }

func growIDs(ids []arena.ID, n int) []arena.ID {
	if cap(ids) < n {
		return make([]arena.ID, n)
	}
	return ids[:n]
}
