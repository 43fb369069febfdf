package engine

import (
	"cmp"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
)

// Leases are how a client outside the daemon's process keeps chunks in
// place between two requests: the RAM objects a lookup hit, the slots a
// store reserved, the slots a retrieve reads in place. Every lease, from
// the local socket or TCP, follows one rule:
//
//   - it ends at a deadline: the default TTL when the client asks for
//     none, what it asks for otherwise, never more than the maximum (10
//     minutes unless configured);
//   - Renew moves the deadline (same rule), Release and CommitStore end it;
//   - one reaper ends overdue leases; the daemon releases the leases of a
//     connection that closes.
//
// A lease holds arena references, so the memory it covers cannot be
// reused or evicted while it lasts, and nothing else: once it ends, the
// references are dropped and the memory is the arena's again. The arena
// and the RAM tier know no deadlines of their own; this table is the only
// place a reference held for a client can lapse.

// LeaseID names a lease. Ids count up from 1 and are never reused while
// the engine is open, so an id whose lease ended stays unknown. The zero
// LeaseID is never valid.
type LeaseID uint64

// Lease errors, reported by CommitStore.
var (
	ErrUnknownLease  = errors.New("engine: lease unknown, expired or released")
	ErrNotStoreLease = errors.New("engine: not a store lease")
)

// Default lease durations; Options.LeaseTTL and MaxLeaseTTL override them.
const (
	DefaultLeaseTTL = 30 * time.Second
	MaxLeaseTTL     = 10 * time.Minute
)

// reapEvery is how often overdue leases are ended.
const reapEvery = 250 * time.Millisecond

type leaseKind uint8

const (
	leaseLookup   leaseKind = iota // references on the RAM chunks of a hit
	leaseStore                     // reservations awaiting CommitStore
	leaseRetrieve                  // references on chunks read in place
)

// lease is one slot of the table. For a store lease ids[j] is the
// reservation for keys[j], or 0 where the chunk was already cached.
type lease struct {
	id       LeaseID // 0 until activated
	kind     leaseKind
	deadline int64 // nanoseconds since the table's epoch
	keys     []chunk.Key
	ids      []arena.ID
	stream   *tier.Stream    // a layerwise retrieve's background fill (layerwise.go)
	save     *tier.LayerSave // a store's per-layer writes (layersave.go)
	noSave   bool            // a store whose layers cannot be saved one by one
	feed     *LayerFeed      // a store pushed while it is filled (layerfeed.go)
	pending  []PendingChunk  // a layerwise retrieve's last chunks, still arriving (pending.go)
	pgeo     tier.LayerGeometry
	pos      int32 // index in byDeadline; notActive while free or being built
	nextFree int32
}

const (
	notActive int32 = -1
	noSlot    int32 = -1
)

// leaseTable is every lease of one engine, by id, and the binary min-heap
// of their slots by deadline, so the reaper finds overdue leases without
// scanning and Release takes one out in O(log n). Slots are pointers so that a
// lease being built outside the lock stays where it is while other slots
// are added; their slices are kept for reuse, so a steady flow of leases
// allocates nothing.
type leaseTable struct {
	arena  *arena.Arena
	defTTL time.Duration
	maxTTL time.Duration
	epoch  time.Time

	mu         sync.Mutex
	seq        LeaseID // the last id handed out
	byID       map[LeaseID]int32
	slots      []*lease
	free       int32
	byDeadline []int32
	closed     bool

	expired atomic.Uint64
	start   sync.Once
	stop    chan struct{}
	done    chan struct{}
}

func newLeaseTable(a *arena.Arena) *leaseTable {
	return &leaseTable{arena: a, defTTL: DefaultLeaseTTL, maxTTL: MaxLeaseTTL, epoch: time.Now(), free: noSlot,
		byID: make(map[LeaseID]int32), stop: make(chan struct{}), done: make(chan struct{})}
}

// setRule replaces the default and maximum durations (0 keeps the
// package defaults); Open calls it before any lease exists.
func (t *leaseTable) setRule(defTTL, maxTTL time.Duration) {
	t.defTTL, t.maxTTL = cmp.Or(max(defTTL, 0), DefaultLeaseTTL), cmp.Or(max(maxTTL, 0), MaxLeaseTTL)
}

// ttl is the lease rule: asked, or the default when asked is 0, capped.
func (t *leaseTable) ttl(asked time.Duration) time.Duration {
	if asked <= 0 {
		return t.defTTL
	}
	return min(asked, t.maxTTL)
}

// build takes a free slot for a lease the caller fills without the lock;
// activate or discard hands it back.
func (t *leaseTable) build(kind leaseKind) (int32, *lease) {
	t.start.Do(func() { go t.reap() })
	t.mu.Lock()
	defer t.mu.Unlock()
	i := t.free
	if i == noSlot {
		i = int32(len(t.slots))
		t.slots = append(t.slots, &lease{pos: notActive})
	} else {
		t.free = t.slots[i].nextFree
	}
	l := t.slots[i]
	l.kind = kind
	l.keys, l.ids = l.keys[:0], l.ids[:0]
	return i, l
}

// activate starts the lease built in slot i with a deadline ttl from now.
// A table closed meanwhile ends it at once and reports 0.
func (t *leaseTable) activate(i int32, ttl time.Duration) LeaseID {
	deadline := t.deadline(ttl)
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.slots[i]
	if t.closed {
		t.freeLocked(i)
		return 0
	}
	t.seq++
	l.id, l.deadline = t.seq, deadline
	t.byID[l.id] = i
	l.pos = int32(len(t.byDeadline))
	t.byDeadline = append(t.byDeadline, i)
	t.up(int(l.pos))
	return l.id
}

// discard drops a lease that was built but not activated.
func (t *leaseTable) discard(i int32) {
	t.mu.Lock()
	t.freeLocked(i)
	t.mu.Unlock()
}

// take ends lease id and hands its slot to the caller, who finishes with
// it (CommitStore) and then calls discard. It reports false for an id that
// is not active.
func (t *leaseTable) take(id LeaseID) (int32, *lease, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.lookup(id)
	if !ok {
		return 0, nil, false
	}
	t.unheap(i)
	return i, t.slots[i], true
}

// release ends lease id and drops its references.
func (t *leaseTable) release(id LeaseID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.lookup(id)
	if ok {
		t.unheap(i)
		t.freeLocked(i)
	}
	return ok
}

// renew moves an active lease's deadline to ttl from now.
func (t *leaseTable) renew(id LeaseID, ttl time.Duration) bool {
	deadline := t.deadline(ttl)
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.lookup(id)
	if ok {
		t.slots[i].deadline = deadline
		t.fix(int(t.slots[i].pos))
		if s := t.slots[i].stream; s != nil { // its reads may run as long as the lease
			s.Extend(t.epoch.Add(time.Duration(deadline)))
		}
	}
	return ok
}

// active reports whether id names a lease that has not ended.
func (t *leaseTable) active(id LeaseID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.lookup(id)
	return ok
}

// count returns how many leases are active.
func (t *leaseTable) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byDeadline)
}

// expire ends every lease whose deadline is at or before now.
func (t *leaseTable) expire(now time.Time) int {
	cutoff := int64(now.Sub(t.epoch))
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for len(t.byDeadline) > 0 {
		i := t.byDeadline[0]
		if t.slots[i].deadline > cutoff {
			break
		}
		t.unheap(i)
		t.freeLocked(i)
		n++
	}
	t.expired.Add(uint64(n))
	return n
}

// reap ends overdue leases until close, so a client that is alive but
// forgot a lease cannot pin memory forever (one that dies loses its
// connection, and the daemon releases its leases at once).
func (t *leaseTable) reap() {
	defer close(t.done)
	tick := time.NewTicker(reapEvery)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case now := <-tick.C:
			t.expire(now)
		}
	}
}

// close stops the reaper and ends every lease. Leases being built when it
// runs end as they are activated.
func (t *leaseTable) close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	for len(t.byDeadline) > 0 {
		i := t.byDeadline[0]
		if s := t.slots[i].stream; s != nil {
			s.Cancel() // the engine is closing: no promotion will be wanted
		}
		t.unheap(i)
		t.freeLocked(i)
	}
	t.mu.Unlock()
	t.start.Do(func() { close(t.done) }) // no reaper was started
	close(t.stop)
	<-t.done
}

// deadline returns now+ttl as nanoseconds since the epoch, saturating.
func (t *leaseTable) deadline(ttl time.Duration) int64 {
	since := int64(time.Since(t.epoch))
	if int64(ttl) > math.MaxInt64-since {
		return math.MaxInt64
	}
	return since + int64(ttl)
}

// lookup returns the slot of an active lease; one taken by CommitStore is
// no longer active, though its id is forgotten only when it is freed.
func (t *leaseTable) lookup(id LeaseID) (int32, bool) {
	i, ok := t.byID[id]
	if !ok || t.slots[i].pos == notActive {
		return 0, false
	}
	return i, true
}

// freeLocked drops slot i's references, forgets its id and puts it on the
// free list.
func (t *leaseTable) freeLocked(i int32) {
	l := t.slots[i]
	for _, id := range l.ids {
		if id != 0 {
			t.arena.Unref(id)
		}
	}
	if l.id != 0 {
		delete(t.byID, l.id)
	}
	if l.save != nil { // ended without a commit: its extents go back
		l.save.Abort()
	}
	if l.feed != nil { // ended without a commit: its pushes fail
		l.feed.end(0)
	}
	l.id, l.keys, l.ids, l.stream, l.save, l.noSave, l.feed = 0, l.keys[:0], l.ids[:0], nil, nil, false, nil
	clear(l.pending)
	l.pending = l.pending[:0]
	l.pos = notActive
	l.nextFree = t.free
	t.free = i
}

// unheap takes active slot i out of the deadline heap.
func (t *leaseTable) unheap(i int32) {
	pos := int(t.slots[i].pos)
	last := len(t.byDeadline) - 1
	if pos != last {
		t.swap(pos, last)
	}
	t.byDeadline = t.byDeadline[:last]
	if pos != last {
		t.fix(pos)
	}
	t.slots[i].pos = notActive
}

// The heap is written out rather than built on container/heap, whose Push
// and Pop would box every index into an interface and allocate.

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
