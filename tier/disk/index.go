package disk

import (
	"sync/atomic"
	"time"

	"kvtier/chunk"
	"kvtier/tier"
	"kvtier/tier/policy"
)

// slotState says where a record is in its life.
type slotState uint8

const (
	slotFree    slotState = iota
	slotWriting           // space reserved, bytes in flight: invisible to readers
	slotLive              // written (and synced): readable and ordered by the policy
	slotEvicted           // chosen by the policy, about to be dropped
)

// slot is one index entry. It holds no pointers, so an index of millions of
// records is invisible to the garbage collector.
type slot struct {
	key      chunk.Key
	seg      uint64     // segment number
	off      int64      // offset of the record's header block in the segment
	size     int64      // payload length
	pinUntil int64      // tier clock (ns) until which eviction must skip the record
	up       chunk.Hash // the parent's key hash (scope: key's) when hasUp, for checkpoints
	state    slotState
	hasUp    bool
}

// parent returns the slot's parent, when it names one.
func (s *slot) parent() parent {
	return parent{key: chunk.Key{Scope: s.key.Scope, Hash: s.up}, ok: s.hasUp}
}

// index maps keys to record locations and orders live records for
// eviction by a policy (package policy), keyed by chunk key rather than
// by slot: slots are reused, and the adaptive policies remember evicted
// keys.
type index struct {
	keys  keyTab // key to slot (keytab.go)
	slots []slot
	free  []int32
	live  int // slots in slotLive

	order   policy.Policy[chunk.Key] // through pol, admit, access and remove (warm.go)
	warm    *warmer                  // the policy is taking in restored keys; nil once done
	warmEnd time.Time                // when it had taken them in (zero: Open restored none)
	full    atomic.Pointer[warmer]   // warm, while its queue is full: read without the lock (waitQueueRoom)
	pinned  func(chunk.Key) bool     // order's busy callback, allocated once
	now     int64                    // the clock victim is asked about, for pinned
	met     []chunk.Key              // pinned keys the last victim search passed
	hdrs    headerCache              // verified headers of records read by ranges (hdrcache.go)

	quota     *tier.Quota          // per-owner accounting (quota.go); nil for none
	quotaBusy func(chunk.Key) bool // pinnedNow, allocated once

	// Records whose parent the policy took in after them (adopt.go):
	// relink, found in the log before their parents at Open, are linked
	// once the policy has every restored record; waitUp, published before
	// their parent's record, when that one is published. Only for a
	// prefix-aware policy (chains).
	relink []warmRec
	waitUp waitUps
	chains bool
	// restoring is set while Open indexes the segments from a checkpoint
	// and the log past it (restoreAll): the policy may be ready before the
	// log's records are indexed, and a parent found there is admitted
	// only when its record is, so pol then leaves the late records in
	// relink for recover to link once every record is in.
	restoring bool
}

func newIndex(order policy.Policy[chunk.Key]) *index {
	x := &index{keys: newKeyTab(0), slots: make([]slot, 1, 64), order: order}
	_, x.chains = order.(policy.Adopter[chunk.Key])
	x.pinned = x.isPinned
	return x
}

func (x *index) get(key chunk.Key) (int32, bool) {
	return x.keys.get(key, x.slots)
}

// liveSlot returns the slot of key if the key is readable.
func (x *index) liveSlot(key chunk.Key) (int32, bool) {
	i, ok := x.keys.get(key, x.slots)
	if !ok || x.slots[i].state != slotLive {
		return 0, false
	}
	return i, true
}

// add stores s (state slotWriting) under s.key and returns its position.
func (x *index) add(s slot) int32 {
	s.state = slotWriting
	var i int32
	if n := len(x.free); n > 0 {
		i = x.free[n-1]
		x.free = x.free[:n-1]
		x.slots[i] = s
	} else {
		i = int32(len(x.slots))
		x.slots = append(x.slots, s)
	}
	x.keys.put(s.key, i, x.slots)
	x.quota.Charge(s.key, recordSize(s.size))
	return i
}

// publish makes a written slot live and admits it to the policy.
func (x *index) publish(i int32) { x.publishAfter(i, parent{}) }

// publishAfter is publish naming the record's parent, when known, for a
// prefix-aware policy.
func (x *index) publishAfter(i int32, up parent) {
	x.publishLive(i, up)
	x.noteParent(x.slots[i].key, up)
}

// publishLive is publishAfter without linking the record's waiting
// children or noting it as waiting: recovery keeps its own list
// (noteRestored).
func (x *index) publishLive(i int32, up parent) {
	s := &x.slots[i]
	if up.ok && up.key.Scope == s.key.Scope { // as the header records it
		s.up, s.hasUp = up.key.Hash, true
	}
	s.state = slotLive
	x.live++
	x.admit(s.key, up)
	x.quota.Admit(s.key)
}

// move points live slot i at another copy of its record (recovery: a key
// found twice in the log), with the parent that copy's header names. The
// policy keeps the key where it is, children and all; a parent it did not
// know is linked with the records restored before their parents.
func (x *index) move(i int32, seg uint64, off, size int64, up parent) {
	s := &x.slots[i]
	if s.size != size {
		x.quota.Release(s.key)
		x.quota.Charge(s.key, recordSize(size))
		x.quota.Admit(s.key)
	}
	s.seg, s.off, s.size = seg, off, size
	s.up, s.hasUp = chunk.Hash{}, false
	if up.ok && up.key.Scope == s.key.Scope {
		s.up, s.hasUp = up.key.Hash, true
		if x.chains {
			x.relink = append(x.relink, warmRec{key: s.key, up: up.key.Hash, hasUp: true})
		}
	}
	x.hdrs.forget(i)
}

// drop forgets slot i entirely. A live record leaves the policy as removed
// (no history kept); an evicted one already left it as evicted.
func (x *index) drop(i int32) {
	s := &x.slots[i]
	if s.state == slotLive {
		x.remove(s.key)
		x.live--
	}
	if s.state == slotWriting && len(x.waitUp.kids) > 0 {
		x.forgetWaiting(s.key)
	}
	x.keys.del(s.key, i)
	x.quota.Release(s.key)
	x.hdrs.forget(i)
	*s = slot{}
	x.free = append(x.free, i)
}

// touch records a hit on slot i.
func (x *index) touch(i int32) {
	x.access(x.slots[i].key)
	x.quota.Access(x.slots[i].key)
}

// victim asks the policy for a record not pinned at time now, takes it out
// of the live set and returns its slot, which the caller must drop; -1
// when every record is pinned. After Open, call it only once the policy is
// ready (policyReady): it waits for it otherwise, lock and all. Pinned
// records met on the way count as accessed afterwards: they are in use,
// and under LRU that moves them out of the next search's way.
func (x *index) victim(now int64) int32 {
	x.now = now
	order := x.pol()
	k, ok := order.Evict(x.pinned)
	for _, m := range x.met {
		order.Access(m)
	}
	x.met = x.met[:0]
	if !ok {
		return -1
	}
	i, _ := x.keys.get(k, x.slots)
	x.slots[i].state = slotEvicted
	x.live--
	return i
}

// isPinned is the policy's busy callback: whether k's record is leased at
// the time victim was asked about.
func (x *index) isPinned(k chunk.Key) bool {
	if i, _ := x.keys.get(k, x.slots); x.slots[i].pinUntil <= x.now {
		return false
	}
	x.met = append(x.met, k)
	return true
}
