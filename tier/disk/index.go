package disk

import "kvtier/chunk"

// slotState says where a record is in its life.
type slotState uint8

const (
	slotFree    slotState = iota
	slotWriting           // space reserved, bytes in flight: invisible to readers
	slotLive              // written (and synced): readable and on the LRU list
)

// slot is one index entry. It holds no pointers, so an index of millions of
// records is invisible to the garbage collector; the LRU list is threaded
// through the slots by position.
type slot struct {
	key      chunk.Key
	seg      uint64 // segment number
	off      int64  // offset of the record's header block in the segment
	size     int64  // payload length
	pinUntil int64  // tier clock (ns) until which eviction must skip the record
	prev     int32  // LRU neighbours; slot 0 is the list's sentinel
	next     int32
	state    slotState
}

// index maps keys to record locations and keeps live records in LRU order
// (most recent next to the sentinel, least recent at its prev).
type index struct {
	byKey map[chunk.Key]int32
	slots []slot
	free  []int32
	live  int // slots in slotLive
}

func newIndex() index {
	return index{byKey: make(map[chunk.Key]int32), slots: make([]slot, 1, 64)}
}

func (x *index) get(key chunk.Key) (int32, bool) {
	i, ok := x.byKey[key]
	return i, ok
}

// liveSlot returns the slot of key if the key is readable.
func (x *index) liveSlot(key chunk.Key) (int32, bool) {
	i, ok := x.byKey[key]
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
	x.byKey[s.key] = i
	return i
}

// publish makes a written slot live and most recently used.
func (x *index) publish(i int32) {
	x.slots[i].state = slotLive
	x.live++
	x.pushFront(i)
}

// drop forgets slot i entirely.
func (x *index) drop(i int32) {
	s := &x.slots[i]
	if s.state == slotLive {
		x.unlink(i)
		x.live--
	}
	delete(x.byKey, s.key)
	*s = slot{}
	x.free = append(x.free, i)
}

// touch marks slot i as most recently used.
func (x *index) touch(i int32) {
	x.unlink(i)
	x.pushFront(i)
}

// victim returns the least recently used slot not pinned at time now, or -1.
// Pinned slots met on the way are moved to the front: they are in use, and
// moving them keeps the next search from walking over them again.
func (x *index) victim(now int64) int32 {
	for n := x.live; n > 0; n-- {
		i := x.slots[0].prev
		if x.slots[i].pinUntil <= now {
			return i
		}
		x.touch(i)
	}
	return -1
}

func (x *index) pushFront(i int32) {
	head := &x.slots[0]
	first := head.next
	x.slots[i].prev = 0
	x.slots[i].next = first
	x.slots[first].prev = i
	x.slots[0].next = i
}

func (x *index) unlink(i int32) {
	s := &x.slots[i]
	x.slots[s.prev].next = s.next
	x.slots[s.next].prev = s.prev
	s.prev, s.next = 0, 0
}
