package arena

import (
	"fmt"
	"math"
	"time"
)

// LeaseID names a lease: slot in the low 32 bits, generation in the high 32,
// like ID. The zero LeaseID is never valid.
type LeaseID uint64

// lease is one slot of the lease table.
type lease struct {
	object   ID
	deadline int64 // nanoseconds since the arena's epoch
	gen      uint32
	pos      int32 // index in leaseTable.byDeadline; none while the slot is free
	nextFree int32
}

// leaseTable holds the leases and a binary min-heap of their slots ordered by
// deadline. Each slot records its heap position, so Release removes its
// entry in O(log n) and the heap never holds dead entries. The heap is
// written out rather than built on container/heap, whose Push and Pop would
// box every index into an interface and allocate.
type leaseTable struct {
	slots      []lease
	free       int32
	byDeadline []int32
}

func newLeaseTable() leaseTable { return leaseTable{free: none} }

func (t *leaseTable) active() int { return len(t.byDeadline) }

func (t *leaseTable) add(object ID, deadline int64) LeaseID {
	i := t.free
	if i == none {
		i = int32(len(t.slots))
		t.slots = append(t.slots, lease{gen: 1})
	} else {
		t.free = t.slots[i].nextFree
	}
	l := &t.slots[i]
	l.object, l.deadline = object, deadline
	l.pos = int32(len(t.byDeadline))
	t.byDeadline = append(t.byDeadline, i)
	t.up(int(l.pos))
	return LeaseID(uint64(l.gen)<<32 | uint64(i))
}

// lookup returns the slot of an active lease, or false when id is expired,
// released or was never issued.
func (t *leaseTable) lookup(id LeaseID) (int32, bool) {
	i := uint64(id) & math.MaxUint32
	if i >= uint64(len(t.slots)) {
		return 0, false
	}
	l := &t.slots[i]
	if l.pos == none || l.gen != uint32(id>>32) {
		return 0, false
	}
	return int32(i), true
}

// remove frees slot i and returns the object the lease held.
func (t *leaseTable) remove(i int32) ID {
	l := &t.slots[i]
	last := len(t.byDeadline) - 1
	pos := int(l.pos)
	if pos != last {
		t.swap(pos, last)
	}
	t.byDeadline = t.byDeadline[:last]
	if pos != last {
		t.fix(pos)
	}
	object := l.object
	l.object, l.pos = 0, none
	l.gen++
	if l.gen == 0 {
		l.gen = 1
	}
	l.nextFree = t.free
	t.free = i
	return object
}

func (t *leaseTable) setDeadline(i int32, deadline int64) {
	t.slots[i].deadline = deadline
	t.fix(int(t.slots[i].pos))
}

// earliest returns the slot with the nearest deadline.
func (t *leaseTable) earliest() (int32, bool) {
	if len(t.byDeadline) == 0 {
		return 0, false
	}
	return t.byDeadline[0], true
}

func (t *leaseTable) less(a, b int) bool {
	return t.slots[t.byDeadline[a]].deadline < t.slots[t.byDeadline[b]].deadline
}

func (t *leaseTable) swap(a, b int) {
	h := t.byDeadline
	h[a], h[b] = h[b], h[a]
	t.slots[h[a]].pos = int32(a)
	t.slots[h[b]].pos = int32(b)
}

func (t *leaseTable) fix(pos int) {
	if !t.down(pos) {
		t.up(pos)
	}
}

func (t *leaseTable) up(pos int) {
	for pos > 0 {
		parent := (pos - 1) / 2
		if !t.less(pos, parent) {
			return
		}
		t.swap(pos, parent)
		pos = parent
	}
}

// down sifts pos towards the leaves and reports whether it moved.
func (t *leaseTable) down(pos int) bool {
	start, n := pos, len(t.byDeadline)
	for {
		child := 2*pos + 1
		if child >= n {
			break
		}
		if right := child + 1; right < n && t.less(right, child) {
			child = right
		}
		if !t.less(child, pos) {
			break
		}
		t.swap(pos, child)
		pos = child
	}
	return pos > start
}

// Lease takes an extra reference on id that lasts until Release or until ttl
// has passed, whichever comes first. Readers in other processes hold leases
// rather than references, so a reader that dies cannot pin memory forever.
func (a *Arena) Lease(id ID, ttl time.Duration) (LeaseID, error) {
	if ttl <= 0 {
		return 0, fmt.Errorf("arena: lease %#x: ttl %v must be positive", uint64(id), ttl)
	}
	now := a.clock() // read before locking: the clock may be slow
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0, ErrClosed
	}
	o := a.objects.get(id)
	if o == nil {
		return 0, fmt.Errorf("arena: lease %#x: %w", uint64(id), ErrStale)
	}
	if o.refs == math.MaxInt32 {
		return 0, fmt.Errorf("arena: lease %#x: reference count saturated", uint64(id))
	}
	a.adjust(id, o, +1, +1)
	return a.leases.add(id, a.deadline(now, ttl)), nil
}

// Release ends a lease and drops its reference. It reports false, and does
// nothing, when the lease already expired, was released, or is unknown.
func (a *Arena) Release(l LeaseID) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	i, ok := a.leases.lookup(l)
	if !ok {
		return false
	}
	a.endLease(i)
	return true
}

// Renew moves an active lease's deadline to ttl from now and reports whether
// the lease was still active.
func (a *Arena) Renew(l LeaseID, ttl time.Duration) bool {
	if ttl <= 0 {
		return false
	}
	now := a.clock()
	a.mu.Lock()
	defer a.mu.Unlock()
	i, ok := a.leases.lookup(l)
	if !ok {
		return false
	}
	a.leases.setDeadline(i, a.deadline(now, ttl))
	return true
}

// ExpireLeases ends every lease whose deadline is at or before now and
// returns how many it ended. The background reaper calls it periodically;
// tests and callers with their own clock may call it directly.
func (a *Arena) ExpireLeases(now time.Time) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0
	}
	return a.expireLocked(now)
}

func (a *Arena) expireLocked(now time.Time) int {
	cutoff := int64(now.Sub(a.epoch))
	n := 0
	for {
		i, ok := a.leases.earliest()
		if !ok || a.leases.slots[i].deadline > cutoff {
			return n
		}
		a.endLease(i)
		n++
	}
}

// endLease frees lease slot i and drops the reference it held.
func (a *Arena) endLease(i int32) {
	id := a.leases.remove(i)
	// A lease holds a reference, so its object is live.
	a.adjust(id, a.objects.get(id), -1, -1)
}

// deadline returns now+ttl as nanoseconds since the epoch, saturating
// instead of overflowing for absurd ttls.
func (a *Arena) deadline(now time.Time, ttl time.Duration) int64 {
	since := int64(now.Sub(a.epoch))
	if int64(ttl) > math.MaxInt64-since {
		return math.MaxInt64
	}
	return since + int64(ttl)
}

// reap expires leases every interval until Close.
func (a *Arena) reap(every time.Duration) {
	defer close(a.reaperDone)
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-a.stopReaper:
			return
		case <-ticker.C:
			a.ExpireLeases(a.clock())
		}
	}
}
