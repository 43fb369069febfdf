package arena

import (
	"fmt"
	"math"
)

// ID names an object. The low 32 bits are a slot in the object table and the
// high 32 bits the slot's generation, which changes every time the slot is
// freed, so an ID kept past its object's lifetime is recognised as stale. The
// zero ID is never valid.
type ID uint64

// object is one slot of the object table; plain integers only, so the table
// is invisible to the garbage collector.
type object struct {
	start    int32 // first page
	pages    int32
	size     int64 // bytes asked for
	refs     int32 // 0 means the slot is free
	gen      uint32
	nextFree int32 // next free slot while this one is free
}

// pinned reports whether dropping one reference (the owner's) would leave
// the object alive.
func (o *object) pinned() bool { return o.refs > 1 }

type objectTable struct {
	slots []object
	free  int32 // first free slot, or none
	live  int
}

func newObjectTable() objectTable { return objectTable{free: none} }

func (t *objectTable) add(start, pages int, size int64) ID {
	i := t.free
	if i == none {
		i = int32(len(t.slots))
		t.slots = append(t.slots, object{gen: 1})
	} else {
		t.free = t.slots[i].nextFree
	}
	o := &t.slots[i]
	o.start, o.pages, o.size = int32(start), int32(pages), size
	o.refs = 1
	t.live++
	return ID(uint64(o.gen)<<32 | uint64(i))
}

// get returns the live object id names, or nil when id is stale or was never
// issued. The pointer is valid until the table next grows, so only while the
// arena's mutex is held.
func (t *objectTable) get(id ID) *object {
	i := uint64(id) & math.MaxUint32
	if i >= uint64(len(t.slots)) {
		return nil
	}
	o := &t.slots[i]
	if o.refs == 0 || o.gen != uint32(id>>32) {
		return nil
	}
	return o
}

func (t *objectTable) remove(id ID) {
	i := int32(uint64(id) & math.MaxUint32)
	o := &t.slots[i]
	o.refs = 0
	o.gen++
	if o.gen == 0 { // keep the zero ID invalid after wrap-around
		o.gen = 1
	}
	o.nextFree = t.free
	t.free = i
	t.live--
}

// Alloc allocates an object of size bytes, page-aligned and rounded up to
// whole pages, with one reference held by the caller. The bytes are not
// zeroed. When no free run is long enough it returns an error wrapping
// ErrNoSpace, and the caller is expected to evict and retry. A size beyond the capacity
// gives ErrTooLarge, which no eviction can cure.
func (a *Arena) Alloc(size int) (ID, error) {
	if size <= 0 {
		return 0, fmt.Errorf("arena: alloc %d bytes: size must be positive", size)
	}
	if int64(size) > a.capacity {
		return 0, fmt.Errorf("arena: alloc %d bytes: %w (capacity %d)", size, ErrTooLarge, a.capacity)
	}
	pages := int((int64(size) + int64(a.pageLen) - 1) >> a.pageShift)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0, ErrClosed
	}
	start, ok := a.runs.take(pages)
	if !ok {
		return 0, fmt.Errorf("arena: alloc %d bytes (%d bytes free in %d runs, longest %d): %w",
			size, int64(a.runs.freePages)<<a.pageShift, a.runs.freeRuns,
			int64(a.runs.largest())<<a.pageShift, ErrNoSpace)
	}
	return a.objects.add(start, pages, int64(size)), nil
}

// Ref adds a reference to id and reports whether id was live.
func (a *Arena) Ref(id ID) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	o := a.objects.get(id)
	if o == nil || o.refs == math.MaxInt32 {
		return false
	}
	a.adjust(id, o, +1)
	return true
}

// Unref drops a reference to id, freeing the object's pages when it was the
// last, and reports whether it dropped one.
func (a *Arena) Unref(id ID) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	o := a.objects.get(id)
	if o == nil {
		return false
	}
	a.adjust(id, o, -1)
	return true
}

// adjust changes an object's reference count, keeps the pinned total in
// step and frees the object when no reference is left.
func (a *Arena) adjust(id ID, o *object, refs int32) {
	wasPinned := o.pinned()
	o.refs += refs
	if isPinned := o.pinned(); isPinned != wasPinned {
		if isPinned {
			a.pinnedPages += int64(o.pages)
		} else {
			a.pinnedPages -= int64(o.pages)
		}
	}
	if o.refs == 0 {
		a.runs.give(int(o.start), int(o.pages))
		a.objects.remove(id)
	}
}

// Bytes returns the object's bytes — len is the size asked for — as a slice
// of the shared mapping, or nil when id is stale. The slice stays valid only
// while the caller holds a reference on id.
func (a *Arena) Bytes(id ID) []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	o := a.objects.get(id)
	if o == nil || a.closed {
		return nil
	}
	off := int64(o.start) << a.pageShift
	end := off + o.size
	return a.mem[off:end:end]
}

// Offset returns the object's byte offset in the mapping (a multiple of
// PageSize), or -1 when id is stale. A process that mapped Fd finds the
// object's bytes at the same offset.
func (a *Arena) Offset(id ID) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	o := a.objects.get(id)
	if o == nil {
		return -1
	}
	return int64(o.start) << a.pageShift
}

// Size returns the object's size as asked for in Alloc, or -1 when id is
// stale.
func (a *Arena) Size(id ID) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	o := a.objects.get(id)
	if o == nil {
		return -1
	}
	return int(o.size)
}

// Refs returns the object's reference count, or 0 when id is stale. An object with one reference is held only by its owner, so
// evicting it frees memory.
func (a *Arena) Refs(id ID) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	o := a.objects.get(id)
	if o == nil {
		return 0
	}
	return int(o.refs)
}
