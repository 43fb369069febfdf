package s3

import (
	"sync"

	"kvtier/chunk"
)

// presence remembers keys recently seen stored, with their sizes, so that
// the manager's presence-then-Size-then-Get sequence costs one HEAD
// rather than two, and a Put of a key already written skips the upload.
//
// It only ever holds positives, and they may go stale when another node
// deletes an object; a stale entry turns into ErrNotFound on Get, which is
// a cache miss to the manager, and Get then forgets the key. Eviction is
// first in, first out over a fixed ring: no allocation once the map has
// grown to its bound, and no pointers for the collector to trace.
type presence struct {
	mu    sync.Mutex
	sizes map[chunk.Key]int64
	ring  []chunk.Key // insertion order; ring[next] is the oldest
	next  int
	full  bool
}

func newPresence(capacity int) *presence {
	return &presence{
		sizes: make(map[chunk.Key]int64, capacity),
		ring:  make([]chunk.Key, capacity),
	}
}

func (p *presence) size(k chunk.Key) (int64, bool) {
	p.mu.Lock()
	n, ok := p.sizes[k]
	p.mu.Unlock()
	return n, ok
}

func (p *presence) add(k chunk.Key, size int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.sizes[k]; ok {
		p.sizes[k] = size
		return
	}
	if p.full {
		// The evicted slot's key may have been forgotten and re-added
		// since; dropping it early costs one extra HEAD, nothing more.
		delete(p.sizes, p.ring[p.next])
	}
	p.ring[p.next] = k
	p.sizes[k] = size
	p.next++
	if p.next == len(p.ring) {
		p.next, p.full = 0, true
	}
}

func (p *presence) forget(k chunk.Key) {
	p.mu.Lock()
	delete(p.sizes, k)
	p.mu.Unlock()
}

func (p *presence) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sizes)
}
