// Package arena is the memory of kvtier's RAM tier: one shared mapping of a
// memfd, outside the Go heap, carved into page-aligned objects that are
// reference counted.
//
// The mapping is MAP_SHARED over a memfd so the daemon can pass Fd to a
// connector in the serving engine (SCM_RIGHTS over a unix socket); the engine
// maps the same bytes and KV never crosses the socket, only offsets do.
//
// Memory. An object is a contiguous run of pages that starts on a page
// boundary, so O_DIRECT disk I/O can target it directly. The allocator (see
// runs) is a best-fit page heap with boundary tags: freeing coalesces with
// both neighbours at once, so no two free runs are ever adjacent and there
// are at most Objects+1 free runs. Fragmentation bound: if every allocation
// made since the arena was last empty spans the same number of pages S, then
// every free run is a whole number of S-page slots except the one that ends
// at the capacity, so Alloc of S pages succeeds whenever at least S pages are
// free — nothing is lost to fragmentation. With mixed sizes there is no such
// worst-case bound; the tests measure the behaviour under the RAM tier's mix
// (mostly full chunks, some partial ones).
//
// Lifetimes. Alloc returns an ID with one reference, the owner's. Ref and
// Unref add and drop references; the pages return to the allocator when the
// count reaches zero. IDs carry a generation, so a stale ID is refused rather
// than pointing into memory that now belongs to someone else. An object
// with more than one reference is pinned: dropping the owner's would not
// free it, so eviction passes it by.
//
// The arena has no deadlines. A reader in another process that crashes
// cannot leak memory because it holds no references itself: the daemon's
// leases (package engine) hold them for it and drop them when the lease is
// released or lapses. With the one lease table and its reaper there, the
// arena has nothing to count but references.
//
// All methods are safe for concurrent use. One mutex guards the metadata and
// is never held while object bytes are read or written.
package arena

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Errors returned by the arena, wrapped with details.
var (
	ErrNoSpace  = errors.New("arena: no free run large enough")
	ErrTooLarge = errors.New("arena: object larger than the arena")
	ErrStale    = errors.New("arena: stale or unknown handle")
	ErrClosed   = errors.New("arena: closed")
)

// Options configure New. Only Capacity is required.
type Options struct {
	// Capacity is the size of the mapping in bytes, rounded down to a
	// multiple of PageSize.
	Capacity int64
	// Name labels the memfd (visible in /proc/<pid>/fd). Default "kvtier-arena".
	Name string
	// HugePages asks for hugetlb pages and, when the hugetlb pool cannot
	// supply them, falls back to ordinary pages marked MADV_HUGEPAGE.
	// Backing reports what was used.
	HugePages bool
	// Prefault makes all pages resident in New instead of on first touch.
	Prefault bool
	// PageSize is the allocation granularity and alignment: a power of two
	// no smaller than the OS page. Default: the OS page size.
	PageSize int
	// Logger receives the one-off note about huge page fallback.
	// Default slog.Default().
	Logger *slog.Logger
}

const defaultName = "kvtier-arena"

// Arena is a shared memory mapping and the objects allocated in it.
type Arena struct {
	mem       []byte
	fd        int
	pageLen   int
	pageShift uint
	capacity  int64
	backing   Backing

	mu          sync.Mutex
	closed      bool
	runs        runs
	objects     objectTable
	pinnedPages int64
}

// New creates the memfd and maps it.
func New(opts Options) (*Arena, error) {
	opts, err := withDefaults(opts)
	if err != nil {
		return nil, err
	}
	capacity := opts.Capacity &^ int64(opts.PageSize-1)
	pages := capacity / int64(opts.PageSize)
	if pages < 1 || pages >= math.MaxInt32 {
		return nil, fmt.Errorf("arena: capacity %d bytes gives %d pages of %d bytes, want 1 to %d pages",
			opts.Capacity, pages, opts.PageSize, math.MaxInt32-1)
	}
	mem, fd, backing, err := mapShared(opts.Name, capacity, opts.HugePages)
	if err != nil {
		return nil, fmt.Errorf("arena: %w", err)
	}
	if opts.HugePages && !backing.HugeTLB {
		opts.Logger.Warn("arena: hugetlb pages unavailable, using ordinary pages",
			"backing", backing.String(), "reason", backing.Fallback)
	}
	if opts.Prefault {
		if err := prefault(mem); err != nil {
			unix.Munmap(mem)
			unix.Close(fd)
			return nil, fmt.Errorf("arena: %w", err)
		}
	}
	return &Arena{
		mem:       mem,
		fd:        fd,
		pageLen:   opts.PageSize,
		pageShift: uint(log2(opts.PageSize)),
		capacity:  capacity,
		backing:   backing,
		runs:      newRuns(int(pages)),
		objects:   newObjectTable(),
	}, nil
}

func withDefaults(opts Options) (Options, error) {
	if opts.Name == "" {
		opts.Name = defaultName
	}
	osPage := os.Getpagesize()
	if opts.PageSize == 0 {
		opts.PageSize = osPage
	}
	if opts.PageSize < osPage || opts.PageSize&(opts.PageSize-1) != 0 {
		return opts, fmt.Errorf("arena: page size %d must be a power of two of at least %d", opts.PageSize, osPage)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return opts, nil
}

func log2(n int) int {
	shift := 0
	for 1<<shift < n {
		shift++
	}
	return shift
}

// Close unmaps the memory and closes the memfd. Slices returned by Bytes
// and Region must not be used afterwards; other processes that mapped the
// fd keep their own mapping.
func (a *Arena) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	a.closed = true
	err := errors.Join(unix.Munmap(a.mem), unix.Close(a.fd))
	a.mem = nil
	a.fd = -1
	if err != nil {
		return fmt.Errorf("arena: close: %w", err)
	}
	return nil
}

// Fd returns the memfd, for passing to another process; -1 after Close. The
// arena keeps ownership: the receiver gets its own copy through SCM_RIGHTS.
func (a *Arena) Fd() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.fd
}

// Backing reports which pages back the mapping.
func (a *Arena) Backing() Backing { return a.backing }

// Capacity returns the size of the mapping in bytes.
func (a *Arena) Capacity() int64 { return a.capacity }

// PageSize returns the allocation granularity.
func (a *Arena) PageSize() int { return a.pageLen }

// Used returns the bytes allocated to objects, counted in whole pages.
func (a *Arena) Used() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.usedLocked()
}

// Pinned returns the bytes, in whole pages, of objects that hold more than
// one reference — memory that dropping the owner's reference would not give
// back.
func (a *Arena) Pinned() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pinnedPages << a.pageShift
}

// Region returns the bytes [off, off+n) of the mapping, for callers that work
// with offsets (the connector protocol). It checks bounds only: the caller
// must hold a reference to whatever lives there.
func (a *Arena) Region(off int64, n int) ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, ErrClosed
	}
	if off < 0 || n < 0 || off > a.capacity || int64(n) > a.capacity-off {
		return nil, fmt.Errorf("arena: region [%d, %d+%d) outside capacity %d", off, off, n, a.capacity)
	}
	return a.mem[off : off+int64(n) : off+int64(n)], nil
}

// Stats is a snapshot of the arena.
type Stats struct {
	Capacity int64 // bytes mapped
	Used     int64 // bytes allocated, in whole pages
	Pinned   int64 // bytes of objects with more than one reference
	Objects  int   // live objects
	// FreeRuns and LargestFree describe fragmentation: the free space is
	// split into FreeRuns runs, the longest LargestFree bytes.
	FreeRuns    int
	LargestFree int64
}

// Stats returns a snapshot of the arena's counters.
func (a *Arena) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Stats{
		Capacity:    a.capacity,
		Used:        a.usedLocked(),
		Pinned:      a.pinnedPages << a.pageShift,
		Objects:     a.objects.live,
		FreeRuns:    a.runs.freeRuns,
		LargestFree: int64(a.runs.largest()) << a.pageShift,
	}
}

func (a *Arena) usedLocked() int64 {
	return (int64(len(a.runs.pages)) - int64(a.runs.freePages)) << a.pageShift
}
