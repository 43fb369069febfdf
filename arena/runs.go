package arena

// runs is the page allocator: a page heap in which every object is one
// contiguous run of pages.
//
// Each run, free or allocated, is tagged on its first and last page with its
// length (positive when free, negative when allocated). Freeing a run reads
// the tags just outside it, so it finds and merges free neighbours in O(1)
// and two free runs are never adjacent. Free runs are also linked into one
// list per exact length, and the set of lengths with a non-empty list answers
// "shortest free run of at least n pages" — best fit — in O(log64 pages).
//
// All metadata is int32 slices indexed by page number or run length: nothing
// the garbage collector has to scan, about 16 bytes per page (0.4% of a 4 KiB
// page).
type runs struct {
	pages []pageTag
	heads []int32 // heads[n] is the first free run of exactly n pages, or none
	sizes sizeSet // the lengths n whose heads[n] is not none

	freePages int
	freeRuns  int
}

// pageTag is the allocator's per-page record. Only the first and last page of
// a run carry a meaningful length; next and prev are meaningful only on the
// first page of a free run. Interior pages hold stale values that are never
// read.
type pageTag struct {
	length int32 // >0: free run of that many pages; <0: allocated run
	next   int32 // free-list links between runs of the same length
	prev   int32
}

const none = -1

func newRuns(total int) runs {
	r := runs{
		pages: make([]pageTag, total),
		heads: make([]int32, total+1),
		sizes: newSizeSet(total + 1),
	}
	for i := range r.heads {
		r.heads[i] = none
	}
	r.insert(0, total)
	return r
}

// take removes n pages from the shortest free run that can hold them and
// returns the first page. When the run is longer, its tail stays free.
func (r *runs) take(n int) (start int, ok bool) {
	length := r.sizes.next(n)
	if length < 0 {
		return 0, false
	}
	start = int(r.heads[length])
	r.unlink(start, length)
	if length > n {
		r.insert(start+n, length-n)
	}
	r.tag(start, n, -int32(n))
	return start, true
}

// give returns the run [start, start+n) and merges it with free neighbours.
func (r *runs) give(start, n int) {
	if start > 0 {
		if left := int(r.pages[start-1].length); left > 0 {
			start -= left
			n += left
			r.unlink(start, left)
		}
	}
	if end := start + n; end < len(r.pages) {
		if right := int(r.pages[end].length); right > 0 {
			r.unlink(end, right)
			n += right
		}
	}
	r.insert(start, n)
}

// largest returns the length of the longest free run.
func (r *runs) largest() int {
	return max(r.sizes.max(), 0)
}

func (r *runs) tag(start, n int, length int32) {
	r.pages[start].length = length
	r.pages[start+n-1].length = length
}

func (r *runs) insert(start, n int) {
	r.tag(start, n, int32(n))
	head := r.heads[n]
	r.pages[start].next = head
	r.pages[start].prev = none
	if head == none {
		r.sizes.add(n)
	} else {
		r.pages[head].prev = int32(start)
	}
	r.heads[n] = int32(start)
	r.freePages += n
	r.freeRuns++
}

func (r *runs) unlink(start, n int) {
	p := &r.pages[start]
	if p.prev == none {
		r.heads[n] = p.next
		if p.next == none {
			r.sizes.remove(n)
		}
	} else {
		r.pages[p.prev].next = p.next
	}
	if p.next != none {
		r.pages[p.next].prev = p.prev
	}
	r.freePages -= n
	r.freeRuns--
}
