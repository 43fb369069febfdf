package index

import (
	"sync"
	"sync/atomic"
)

// A holder word packs one (block, pod) entry: the pod in the high 16 bits and
// a bitmask of the tiers the pod holds the block in, in the low bits.
const (
	holderPodShift = 16
	holderTierMask = 1<<NumTiers - 1
)

func holderWord(pod PodID, tiers uint32) uint32 { return uint32(pod)<<holderPodShift | tiers }
func holderPod(w uint32) PodID                  { return PodID(w >> holderPodShift) }

// Slot metadata: the holder count in the low bits (0 marks an empty slot) and
// the CLOCK reference bit at the top.
const (
	metaCountMask = 1<<17 - 1
	metaRef       = 1 << 31
)

const (
	inlineHolders = 4 // holders stored in the slot itself
	chunkHolders  = 7 // holders per overflow chunk (chunk is 32 bytes)
)

// slot is one cell of a shard's open-addressing table (32 bytes). Up to
// inlineHolders holders live inline; the rest live in a chain of overflow
// chunks referenced by index, never by pointer, so the GC never scans tables.
type slot struct {
	hash uint64
	inl  [inlineHolders]uint32
	ovf  uint32 // 1-based index of the first overflow chunk; 0 = none
	meta uint32 // holder count | metaRef; read atomically because readers set metaRef
}

// chunk holds overflow holders of one block. next links the block's chain, or
// the shard's free list when the chunk is unused.
type chunk struct {
	h    [chunkHolders]uint32
	next uint32 // 1-based chunk index; 0 = end
}

// shard is a linear-probing hash table from block hash to holders, with
// backward-shift deletion (no tombstones) and CLOCK eviction once it holds
// limit blocks.
type shard struct {
	mu        sync.RWMutex
	slots     []slot
	chunks    []chunk
	freeChunk uint32 // 1-based head of the free chunk list
	shift     uint   // bits of the mixed hash consumed by shard selection
	limit     int    // most blocks this shard may hold: its share plus slack
	maxSlots  int    // table size at which limit blocks stay under 3/4 load
	blocks    int
	entries   int // (block, pod) holders
	hand      int // CLOCK hand
	evictions uint64
	_         [64]byte // keeps neighbouring shards' locks off this cache line
}

const minSlots = 16

func newShard(limit int, shift uint, prealloc bool) shard {
	maxSlots := minSlots
	for maxSlots*3/4 < limit {
		maxSlots *= 2
	}
	size := minSlots
	if prealloc {
		size = maxSlots
	}
	return shard{slots: make([]slot, size), shift: shift, limit: limit, maxSlots: maxSlots}
}

// mix spreads engine block hashes (which may be small or sequential in
// tests) over all 64 bits: splitmix64's finalizer.
func mix(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

func (sh *shard) home(h uint64) int {
	return int(mix(h)>>sh.shift) & (len(sh.slots) - 1)
}

func slotCount(s *slot) int { return int(atomic.LoadUint32(&s.meta) & metaCountMask) }

// find returns the position of h, or -1. Caller holds mu (read or write).
func (sh *shard) find(h uint64) int {
	mask := len(sh.slots) - 1
	for pos := sh.home(h); ; pos = (pos + 1) & mask {
		s := &sh.slots[pos]
		if slotCount(s) == 0 {
			return -1
		}
		if s.hash == h {
			return pos
		}
	}
}

// touch sets the CLOCK reference bit; safe under the read lock.
func touch(s *slot) {
	if atomic.LoadUint32(&s.meta)&metaRef == 0 {
		atomic.OrUint32(&s.meta, metaRef)
	}
}

// appendHolders appends the holder words of s to dst. Caller holds mu.
func (sh *shard) appendHolders(dst []uint32, s *slot) []uint32 {
	n := slotCount(s)
	k := min(n, inlineHolders)
	dst = append(dst, s.inl[:k]...)
	rest := n - k
	for c := s.ovf; rest > 0; {
		ch := &sh.chunks[c-1]
		m := min(rest, chunkHolders)
		dst = append(dst, ch.h[:m]...)
		rest -= m
		c = ch.next
	}
	return dst
}

// holderAt returns a pointer to the k-th holder of s. The pointer is valid
// until the next chunk allocation.
func (sh *shard) holderAt(s *slot, k int) *uint32 {
	if k < inlineHolders {
		return &s.inl[k]
	}
	k -= inlineHolders
	c := s.ovf
	for ; k >= chunkHolders; k -= chunkHolders {
		c = sh.chunks[c-1].next
	}
	return &sh.chunks[c-1].h[k]
}

// findHolder returns the index and word pointer of pod's holder in s, or -1.
func (sh *shard) findHolder(s *slot, pod PodID) (int, *uint32) {
	n := int(s.meta & metaCountMask)
	for k := 0; k < n && k < inlineHolders; k++ {
		if holderPod(s.inl[k]) == pod {
			return k, &s.inl[k]
		}
	}
	k := inlineHolders
	for c := s.ovf; k < n; {
		ch := &sh.chunks[c-1]
		for j := 0; j < chunkHolders && k < n; j, k = j+1, k+1 {
			if holderPod(ch.h[j]) == pod {
				return k, &ch.h[j]
			}
		}
		c = ch.next
	}
	return -1, nil
}

func (sh *shard) allocChunk() uint32 {
	if c := sh.freeChunk; c != 0 {
		sh.freeChunk = sh.chunks[c-1].next
		sh.chunks[c-1] = chunk{}
		return c
	}
	sh.chunks = append(sh.chunks, chunk{})
	return uint32(len(sh.chunks))
}

func (sh *shard) releaseChunk(c uint32) {
	sh.chunks[c-1] = chunk{next: sh.freeChunk}
	sh.freeChunk = c
}

// chunkAt returns the 1-based index of the i-th overflow chunk of s.
func (sh *shard) chunkAt(s *slot, i int) uint32 {
	c := s.ovf
	for ; i > 0; i-- {
		c = sh.chunks[c-1].next
	}
	return c
}

// appendHolder adds w as the last holder of the slot at pos.
func (sh *shard) appendHolder(pos int, w uint32) {
	s := &sh.slots[pos]
	n := int(s.meta & metaCountMask)
	if over := n - inlineHolders; over >= 0 && over%chunkHolders == 0 {
		c := sh.allocChunk() // may move sh.chunks; link afterwards
		if over == 0 {
			s.ovf = c
		} else {
			sh.chunks[sh.chunkAt(s, over/chunkHolders-1)-1].next = c
		}
	}
	*sh.holderAt(s, n) = w
	s.meta++
	sh.entries++
}

// removeHolder drops the k-th holder of s by moving the last one into its
// place, and frees a chunk left empty.
func (sh *shard) removeHolder(s *slot, k int) {
	n := int(s.meta&metaCountMask) - 1
	*sh.holderAt(s, k) = *sh.holderAt(s, n)
	s.meta--
	sh.entries--
	over := n - inlineHolders
	if over < 0 || over%chunkHolders != 0 {
		return
	}
	if over == 0 {
		sh.releaseChunk(s.ovf)
		s.ovf = 0
		return
	}
	prev := &sh.chunks[sh.chunkAt(s, over/chunkHolders-1)-1]
	sh.releaseChunk(prev.next)
	prev.next = 0
}

// deleteSlot removes the block at pos with all its holders, shifting later
// members of the probe run back so lookups need no tombstones.
func (sh *shard) deleteSlot(pos int) {
	s := &sh.slots[pos]
	for c := s.ovf; c != 0; {
		next := sh.chunks[c-1].next
		sh.releaseChunk(c)
		c = next
	}
	sh.entries -= int(s.meta & metaCountMask)
	sh.blocks--
	mask := len(sh.slots) - 1
	hole := pos
	for j := (hole + 1) & mask; sh.slots[j].meta&metaCountMask != 0; j = (j + 1) & mask {
		h := sh.home(sh.slots[j].hash)
		// The entry at j may fill the hole only if its home is not
		// cyclically within (hole, j].
		if hole <= j {
			if hole < h && h <= j {
				continue
			}
		} else if hole < h || h <= j {
			continue
		}
		sh.slots[hole] = sh.slots[j]
		hole = j
	}
	sh.slots[hole] = slot{}
}

// insert claims a slot for the absent hash h, evicting or growing first as
// needed. *room is how many more blocks the whole index may hold; insert
// evicts from this shard until there is room (an empty shard cannot, and
// the overshoot is worked off by later inserts elsewhere) and updates it.
// The caller must give the slot a holder before unlocking.
func (sh *shard) insert(h uint64, room *int) int {
	if sh.blocks >= sh.limit {
		sh.evict()
		*room++
	}
	for *room <= 0 && sh.blocks > 0 {
		sh.evict()
		*room++
	}
	*room--
	if (sh.blocks+1)*4 > len(sh.slots)*3 && len(sh.slots) < sh.maxSlots {
		sh.grow()
	}
	mask := len(sh.slots) - 1
	pos := sh.home(h)
	for sh.slots[pos].meta&metaCountMask != 0 {
		pos = (pos + 1) & mask
	}
	sh.slots[pos] = slot{hash: h, meta: metaRef}
	sh.blocks++
	return pos
}

// evict removes one block chosen by CLOCK: the hand sweeps the table,
// clearing reference bits, and takes the first block whose bit is already
// clear. A block is referenced whenever it is added to or read.
func (sh *shard) evict() {
	mask := len(sh.slots) - 1
	for {
		pos := sh.hand
		sh.hand = (pos + 1) & mask
		s := &sh.slots[pos]
		switch {
		case s.meta&metaCountMask == 0:
		case s.meta&metaRef != 0:
			s.meta &^= metaRef
		default:
			sh.deleteSlot(pos)
			sh.evictions++
			return
		}
	}
}

func (sh *shard) grow() {
	old := sh.slots
	sh.slots = make([]slot, 2*len(old))
	mask := len(sh.slots) - 1
	for i := range old {
		if old[i].meta&metaCountMask == 0 {
			continue
		}
		pos := sh.home(old[i].hash)
		for sh.slots[pos].meta&metaCountMask != 0 {
			pos = (pos + 1) & mask
		}
		sh.slots[pos] = old[i]
	}
	sh.hand &= mask
}

// add records that pod holds h in the tiers of bit; room is as for insert.
func (sh *shard) add(h uint64, pod PodID, bit uint32, room *int) {
	pos := sh.find(h)
	if pos < 0 {
		pos = sh.insert(h, room)
		sh.appendHolder(pos, holderWord(pod, bit))
		return
	}
	s := &sh.slots[pos]
	s.meta |= metaRef
	if _, w := sh.findHolder(s, pod); w != nil {
		*w |= bit
		return
	}
	sh.appendHolder(pos, holderWord(pod, bit))
}

// drop clears the tiers in bits from pod's holder of the slot at pos,
// removing the holder and then the block when nothing is left. It reports
// whether the slot was deleted.
func (sh *shard) drop(pos int, pod PodID, bits uint32) bool {
	s := &sh.slots[pos]
	k, w := sh.findHolder(s, pod)
	if w == nil {
		return false
	}
	*w &^= bits
	if *w&holderTierMask != 0 {
		return false
	}
	sh.removeHolder(s, k)
	if s.meta&metaCountMask != 0 {
		return false
	}
	sh.deleteSlot(pos)
	return true
}

// dropAll clears bits from pod's holder in every block of the shard and
// returns how many blocks it deleted.
func (sh *shard) dropAll(pod PodID, bits uint32) int {
	deleted := 0
	for pos := 0; pos < len(sh.slots); {
		// A deletion shifts a later block into pos: look at pos again.
		if sh.slots[pos].meta&metaCountMask != 0 && sh.drop(pos, pod, bits) {
			deleted++
			continue
		}
		pos++
	}
	return deleted
}
