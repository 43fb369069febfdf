package arena

import (
	"fmt"
)

// checkInvariants walks every structure of the arena and reports the first
// inconsistency: run tags, free lists, the size set, counters, the object
// table and pinned bytes.
func (a *Arena) checkInvariants() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.runs.check(); err != nil {
		return err
	}
	return a.checkObjects()
}

func (r *runs) check() error {
	total := len(r.pages)
	freePages, freeRuns := 0, 0
	prevFree := false
	for p := 0; p < total; {
		length := int(r.pages[p].length)
		n := length
		if n < 0 {
			n = -n
		}
		if n == 0 || p+n > total {
			return fmt.Errorf("run at page %d has length tag %d", p, length)
		}
		if end := int(r.pages[p+n-1].length); end != length {
			return fmt.Errorf("run at page %d: first tag %d, last tag %d", p, length, end)
		}
		isFree := length > 0
		if isFree && prevFree {
			return fmt.Errorf("free run at page %d follows another free run: not coalesced", p)
		}
		if isFree {
			freePages += n
			freeRuns++
		}
		prevFree = isFree
		p += n
	}
	if freePages != r.freePages || freeRuns != r.freeRuns {
		return fmt.Errorf("walk found %d free pages in %d runs, counters say %d in %d",
			freePages, freeRuns, r.freePages, r.freeRuns)
	}
	listed := 0
	for n := 1; n < len(r.heads); n++ {
		head := r.heads[n]
		inSet := r.sizes.next(n) == n
		if (head != none) != inSet {
			return fmt.Errorf("length %d: list head %d but size set membership %v", n, head, inSet)
		}
		prev := int32(none)
		for s := head; s != none; s = r.pages[s].next {
			if int(r.pages[s].length) != n {
				return fmt.Errorf("run at page %d on list %d has tag %d", s, n, r.pages[s].length)
			}
			if r.pages[s].prev != prev {
				return fmt.Errorf("run at page %d: prev link %d, want %d", s, r.pages[s].prev, prev)
			}
			prev = s
			listed++
			if listed > freeRuns {
				return fmt.Errorf("free lists hold more runs than the %d free runs (cycle?)", freeRuns)
			}
		}
	}
	if listed != freeRuns {
		return fmt.Errorf("free lists hold %d runs, walk found %d", listed, freeRuns)
	}
	return nil
}

func (a *Arena) checkObjects() error {
	live := 0
	var pinned, usedPages int64
	starts := map[int32]bool{}
	freeSlots := 0
	for i := a.objects.free; i != none; i = a.objects.slots[i].nextFree {
		if a.objects.slots[i].refs != 0 {
			return fmt.Errorf("object slot %d is on the free list with %d references", i, a.objects.slots[i].refs)
		}
		if freeSlots++; freeSlots > len(a.objects.slots) {
			return fmt.Errorf("the object free list is longer than the table (cycle?)")
		}
	}
	for i := range a.objects.slots {
		o := &a.objects.slots[i]
		if o.refs < 0 {
			return fmt.Errorf("object slot %d: %d references", i, o.refs)
		}
		if o.gen == 0 { // generation 0 would make the zero ID valid
			return fmt.Errorf("object slot %d has generation 0", i)
		}
		if o.refs == 0 {
			continue
		}
		id := ID(uint64(o.gen)<<32 | uint64(i))
		live++
		if starts[o.start] {
			return fmt.Errorf("two objects start at page %d", o.start)
		}
		starts[o.start] = true
		usedPages += int64(o.pages)
		if o.pinned() {
			pinned += int64(o.pages)
		}
		if tag := a.runs.pages[o.start].length; int(tag) != -int(o.pages) {
			return fmt.Errorf("object %#x at page %d: run tag %d, want %d", uint64(id), o.start, tag, -o.pages)
		}
	}
	for p := 0; p < len(a.runs.pages); {
		length := int(a.runs.pages[p].length)
		if length < 0 {
			if _, ok := starts[int32(p)]; !ok {
				return fmt.Errorf("allocated run at page %d belongs to no object", p)
			}
			length = -length
		}
		p += length
	}
	if live+freeSlots != len(a.objects.slots) {
		return fmt.Errorf("%d live objects and %d free slots in a table of %d", live, freeSlots, len(a.objects.slots))
	}
	if live != a.objects.live {
		return fmt.Errorf("%d live objects, counter says %d", live, a.objects.live)
	}
	if want := int64(len(a.runs.pages) - a.runs.freePages); usedPages != want {
		return fmt.Errorf("objects hold %d pages, allocator says %d used", usedPages, want)
	}
	if pinned != a.pinnedPages {
		return fmt.Errorf("pinned pages %d, counter says %d", pinned, a.pinnedPages)
	}
	return nil
}
