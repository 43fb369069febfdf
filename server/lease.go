package server

import (
	"sync/atomic"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
)

type leaseKind uint8

const (
	leaseLookup   leaseKind = iota // arena refs on hit chunks in RAM
	leaseStore                     // reservations awaiting COMMIT_STORE
	leaseRetrieve                  // arena refs on chunks being read in place
)

// lease holds arena references on a client's behalf until it is released,
// committed, expires, or the connection closes. For a store, ids[j] is the
// reservation for keys[j], or 0 where the chunk was already cached.
type lease struct {
	kind     leaseKind
	deadline time.Time
	keys     []chunk.Key
	ids      []arena.ID
}

// leaseTable is one connection's leases. The connection's goroutine and
// the service's reaper both use it, under the session's mutex.
type leaseTable struct {
	byID map[uint64]*lease
	free []*lease // released leases, kept to reuse their slices
	// held counts the leases of every connection, for the leases metric;
	// add and remove keep it in step with byID.
	held *atomic.Int64
}

func (t *leaseTable) add(id uint64, l *lease) {
	t.byID[id] = l
	t.held.Add(1)
}

// remove takes lease id out of the table; the caller drops it.
func (t *leaseTable) remove(id uint64) (*lease, bool) {
	l, ok := t.byID[id]
	if ok {
		delete(t.byID, id)
		t.held.Add(-1)
	}
	return l, ok
}

func (t *leaseTable) get() *lease {
	if n := len(t.free); n > 0 {
		l := t.free[n-1]
		t.free = t.free[:n-1]
		return l
	}
	return new(lease)
}

// drop releases l's references and recycles it.
func (t *leaseTable) drop(a *arena.Arena, l *lease) {
	for _, id := range l.ids {
		if id != 0 {
			a.Unref(id)
		}
	}
	l.keys, l.ids = l.keys[:0], l.ids[:0]
	if len(t.free) < 64 {
		t.free = append(t.free, l)
	}
}
