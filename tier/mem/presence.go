package mem

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"sync/atomic"

	"kvtier/arena"
	"kvtier/chunk"
)

// keyIndex is the RAM tier's index: a map from key to arena object, which
// writers change and read under the tier's mutex, and beside it a presence
// set that answers "is this key stored?" without any lock, so that LOOKUPs
// from many connections never queue on the mutex. Every change of the map
// goes through put and del, which update both; the index is not a map so
// that no code can change one without the other.
type keyIndex struct {
	ids map[chunk.Key]arena.ID
	set presenceSet
}

func (x *keyIndex) init() {
	x.ids = make(map[chunk.Key]arena.ID)
	x.set.init()
}

// get, put, del and len are for holders of the tier's mutex.
func (x *keyIndex) get(k chunk.Key) (arena.ID, bool) {
	id, ok := x.ids[k]
	return id, ok
}

func (x *keyIndex) put(k chunk.Key, id arena.ID) {
	x.ids[k] = id
	x.set.add(k, len(x.ids))
}

func (x *keyIndex) del(k chunk.Key) {
	delete(x.ids, k)
	x.set.del(k)
}

func (x *keyIndex) len() int { return len(x.ids) }

// presenceSet is an open-addressed hash set of keys with linear probing.
// One writer at a time (the tier's mutex) adds and deletes; readers probe
// concurrently with no lock. Each slot is guarded by a sequence number the
// writer makes odd while it changes the slot, so a reader never takes half
// of one key for another: it reads the number, the slot, the number again,
// and retries if they differ. Keys never move within a table: a table
// that fills up (live keys plus tombstones past three quarters) is rebuilt
// into a new one, published by an atomic pointer, and readers still on the
// old one see the set as it was just before.
//
// A lookup of several keys probes them one by one, so under concurrent
// stores and evictions its answer may not be the state at any single
// instant; it is the hint a lookup is. Acquire, which hands out chunks,
// stays under the mutex.
type presenceSet struct {
	tab  atomic.Pointer[presenceTable]
	seed uint64 // so that chosen raw keys cannot pile into one probe run
	dead int    // tombstones in the current table (writer only)
}

type presenceTable struct {
	slots []presenceSlot
	mask  uint64
}

// presenceSlot is one key; 32 bytes, two to a cache line.
type presenceSlot struct {
	seq   atomic.Uint32 // odd while the writer changes the slot
	state atomic.Uint32 // slotEmpty, slotLive or slotDead
	scope atomic.Uint64
	lo    atomic.Uint64
	hi    atomic.Uint64
}

const (
	slotEmpty uint32 = iota
	slotLive
	slotDead

	minPresenceSlots = 64
	// A reader that finds a slot changing this many times in a row (a
	// writer descheduled in the middle of it) gives up and asks the map.
	maxSlotRetries = 64
)

func (s *presenceSet) init() {
	s.seed = rand.Uint64() | 1
	s.tab.Store(newPresenceTable(minPresenceSlots))
}

func newPresenceTable(n int) *presenceTable {
	return &presenceTable{slots: make([]presenceSlot, n), mask: uint64(n - 1)}
}

func (s *presenceSet) hash(k chunk.Key) uint64 {
	lo := binary.LittleEndian.Uint64(k.Hash[:8])
	hi := binary.LittleEndian.Uint64(k.Hash[8:])
	h := (lo ^ s.seed) * 0x9e3779b97f4a7c15
	h ^= hi ^ k.Scope
	h *= 0xbf58476d1ce4e5b9
	return h ^ h>>31
}

// find returns the slot holding k, or -1, and the first reusable slot
// (empty or dead) on k's probe run. Writer only.
func (t *presenceTable) find(h uint64, k chunk.Key) (at, free int) {
	lo, hi := binary.LittleEndian.Uint64(k.Hash[:8]), binary.LittleEndian.Uint64(k.Hash[8:])
	free = -1
	for i, n := h&t.mask, 0; n <= int(t.mask); i, n = (i+1)&t.mask, n+1 {
		sl := &t.slots[i]
		switch sl.state.Load() {
		case slotEmpty:
			if free < 0 {
				free = int(i)
			}
			return -1, free
		case slotDead:
			if free < 0 {
				free = int(i)
			}
		default:
			if sl.lo.Load() == lo && sl.hi.Load() == hi && sl.scope.Load() == k.Scope {
				return int(i), free
			}
		}
	}
	return -1, free
}

// add puts k in the set; live is the number of keys stored with it.
// Writer only.
func (s *presenceSet) add(k chunk.Key, live int) {
	t := s.tab.Load()
	if (live+s.dead)*4 > len(t.slots)*3 {
		t = s.rebuild(t, live)
	}
	at, free := t.find(s.hash(k), k)
	if at >= 0 {
		return
	}
	sl := &t.slots[free]
	if sl.state.Load() == slotDead {
		s.dead--
	}
	sl.seq.Add(1)
	sl.scope.Store(k.Scope)
	sl.lo.Store(binary.LittleEndian.Uint64(k.Hash[:8]))
	sl.hi.Store(binary.LittleEndian.Uint64(k.Hash[8:]))
	sl.state.Store(slotLive)
	sl.seq.Add(1)
}

// del removes k from the set, leaving a tombstone. Writer only.
func (s *presenceSet) del(k chunk.Key) {
	t := s.tab.Load()
	at, _ := t.find(s.hash(k), k)
	if at < 0 {
		return
	}
	sl := &t.slots[at]
	sl.seq.Add(1)
	sl.state.Store(slotDead)
	sl.seq.Add(1)
	s.dead++
}

// rebuild copies the live keys of old into a new table with room for
// twice live (at least), drops the tombstones and publishes it.
func (s *presenceSet) rebuild(old *presenceTable, live int) *presenceTable {
	n := max(minPresenceSlots, 1<<bits.Len(uint(2*live)))
	t := newPresenceTable(n)
	for i := range old.slots {
		o := &old.slots[i]
		if o.state.Load() != slotLive {
			continue
		}
		k := chunk.Key{Scope: o.scope.Load()}
		binary.LittleEndian.PutUint64(k.Hash[:8], o.lo.Load())
		binary.LittleEndian.PutUint64(k.Hash[8:], o.hi.Load())
		_, free := t.find(s.hash(k), k)
		sl := &t.slots[free]
		sl.scope.Store(k.Scope)
		sl.lo.Store(o.lo.Load())
		sl.hi.Store(o.hi.Load())
		sl.state.Store(slotLive)
	}
	s.dead = 0
	s.tab.Store(t)
	return t
}

// contains reports whether k is in the set; sure is false when a slot
// kept changing under the probe, and the caller must ask the map. Safe
// for concurrent use with the writer.
func (s *presenceSet) contains(k chunk.Key) (found, sure bool) {
	t := s.tab.Load()
	lo, hi := binary.LittleEndian.Uint64(k.Hash[:8]), binary.LittleEndian.Uint64(k.Hash[8:])
	for i, n := s.hash(k)&t.mask, 0; n <= int(t.mask); i, n = (i+1)&t.mask, n+1 {
		state, match, ok := t.slots[i].read(lo, hi, k.Scope)
		switch {
		case !ok:
			return false, false
		case state == slotEmpty:
			return false, true
		case state == slotLive && match:
			return true, true
		}
	}
	return false, true
}

// read returns the slot's state and whether it holds the key (lo, hi,
// scope), as one consistent snapshot; ok is false if the writer kept
// changing the slot.
func (sl *presenceSlot) read(lo, hi, scope uint64) (state uint32, match, ok bool) {
	for range maxSlotRetries {
		v := sl.seq.Load()
		if v&1 != 0 {
			continue
		}
		state = sl.state.Load()
		match = sl.lo.Load() == lo && sl.hi.Load() == hi && sl.scope.Load() == scope
		if sl.seq.Load() == v {
			return state, match, true
		}
	}
	return 0, false, false
}

// has reports whether the tier stores k, from the presence set, or from
// the map under the mutex when the set could not tell.
func (t *Tier) has(k chunk.Key) bool {
	if found, sure := t.index.set.contains(k); sure {
		return found
	}
	t.mu.Lock()
	_, ok := t.index.get(k)
	t.mu.Unlock()
	return ok
}
