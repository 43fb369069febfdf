package redis

import (
	"encoding/binary"
	"math/bits"
	"sync"

	"kvtier/chunk"
)

// presence remembers keys recently seen stored, with their sizes, so that
// the Size calls the manager makes before each Get (to find which tier
// holds a chunk, then to size the buffer) cost no round trip.
// It is direct-mapped: a key has one slot, chosen by its hash, and a newer
// key simply overwrites an older one there. That bounds memory with no
// eviction bookkeeping and no allocation. An entry can go stale when Redis
// expires or evicts the key; the Get that follows then finds nothing,
// reports ErrNotFound (a miss to the manager) and forgets the entry.
type presence struct {
	mu    sync.Mutex
	slots []slot // len is a power of two, or 0 when disabled
}

type slot struct {
	key  chunk.Key
	size int // 0 marks an empty slot: stored objects are never empty
}

func newPresence(n int) *presence {
	if n <= 0 {
		return &presence{}
	}
	return &presence{slots: make([]slot, 1<<bits.Len(uint(n-1)))}
}

// index picks k's slot. Key hashes are uniformly random, so a few of their
// bits mixed with the scope spread keys evenly.
func (p *presence) index(k chunk.Key) int {
	h := binary.LittleEndian.Uint64(k.Hash[:8]) ^ k.Scope
	return int(h & uint64(len(p.slots)-1))
}

// size returns k's remembered size, or false when k is not remembered.
func (p *presence) size(k chunk.Key) (int, bool) {
	if len(p.slots) == 0 {
		return 0, false
	}
	i := p.index(k)
	p.mu.Lock()
	s := p.slots[i]
	p.mu.Unlock()
	if s.size == 0 || s.key != k {
		return 0, false
	}
	return s.size, true
}

// add remembers that k is stored with size bytes.
func (p *presence) add(k chunk.Key, size int) {
	if len(p.slots) == 0 || size <= 0 {
		return
	}
	i := p.index(k)
	p.mu.Lock()
	p.slots[i] = slot{key: k, size: size}
	p.mu.Unlock()
}

// forget drops k if it is remembered.
func (p *presence) forget(k chunk.Key) {
	if len(p.slots) == 0 {
		return
	}
	i := p.index(k)
	p.mu.Lock()
	if p.slots[i].key == k {
		p.slots[i] = slot{}
	}
	p.mu.Unlock()
}
