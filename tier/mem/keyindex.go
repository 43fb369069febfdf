package mem

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"

	"kvtier/arena"
	"kvtier/chunk"
)

// keyIndex maps a chunk key to its arena object. It replaces a Go map on
// the LOOKUP path, where a map of 24-byte keys spends most of a probe in
// the runtime's generic hashing and key comparison; here the hash is two
// 64×64→128-bit multiplies and the comparison three words.
//
// Layout. A directory of segments, chosen by the hash's top bits
// (extendible hashing); each segment is a Robin Hood table with linear
// probing, homed by the hash's low bits. A segment doubles up to
// maxSegSlots and then splits in two, so growth never rehashes more than
// one segment at a time: the tier's write lock, which lookups wait for, is
// held for a few microseconds, not for a rehash of millions of keys.
//
// Robin Hood keeps each key's distance from its home in a byte (ctrl)
// and keeps the distances short and even (an insert takes the slot of a
// key nearer its own home); a delete shifts the following run back, so
// there are no tombstones. A lookup compares keys only, from the home
// slot up to the longest distance the segment has had (far, single
// digits at these loads), and reads no ctrl: a hit mostly costs one
// cache line of slots, a miss a few more, contiguous.
//
// Hashing. Key kind 1 lets a client choose the chunk hashes it stores, so
// the slot must not follow from them alone: the hash mixes the key with
// seeds drawn per index, and a client cannot aim collisions at a slot it
// cannot compute. A probe longer than maxDist (not seen with random
// hashes at a load of 3/4) draws new seeds and rehashes every key:
// splitting would not separate keys of one hash.
//
// Memory: 33 bytes per slot (the 24-byte key, the 8-byte id, the
// distance byte) at a load between 3/8 and 3/4, 44–88 bytes per key.
type keyIndex struct {
	dir   []*segment // 1 << depth entries; a segment of local depth d fills 1 << (depth-d) of them
	depth uint       // global depth: the hash's top depth bits choose the directory entry
	n     int
	seed  [4]uint64
}

// segment is one Robin Hood table. ctrl[i] is 0 for an empty slot, else
// 1 + the distance of slots[i] from its home.
type segment struct {
	depth uint // local depth: how many top hash bits all its keys share
	mask  uint64
	n     int
	far   uint8 // the longest distance of a key from its home since the segment was made
	ctrl  []uint8
	slots []islot
}

type islot struct {
	key chunk.Key
	id  arena.ID
}

const (
	minSegSlots = 8
	maxSegSlots = 1024 // a split rehashes at most 768 keys
	maxDist     = 64   // the largest ctrl value; an insert that needs more rehashes
)

func newKeyIndex() *keyIndex {
	ix := &keyIndex{}
	ix.reset()
	return ix
}

// reset empties the index and draws fresh seeds.
func (ix *keyIndex) reset() {
	for i := range ix.seed {
		ix.seed[i] = rand.Uint64()
	}
	ix.seed[3] |= 1
	ix.dir = []*segment{newSegment(minSegSlots, 0)}
	ix.depth = 0
	ix.n = 0
}

func newSegment(slots int, depth uint) *segment {
	return &segment{depth: depth, mask: uint64(slots - 1),
		ctrl: make([]uint8, slots), slots: make([]islot, slots)}
}

// Len returns the number of keys held.
func (ix *keyIndex) Len() int { return ix.n }

// hash mixes the key with the index's seeds: a multiply-fold of the two
// halves of the chunk hash, then of that with the scope.
func (ix *keyIndex) hash(k *chunk.Key) uint64 {
	lo := binary.LittleEndian.Uint64(k.Hash[0:8])
	hi := binary.LittleEndian.Uint64(k.Hash[8:16])
	a, b := bits.Mul64(lo^ix.seed[0], hi^ix.seed[1])
	c, d := bits.Mul64(a^b^ix.seed[2], k.Scope^ix.seed[3])
	return c ^ d
}

// segment returns the segment holding hash h. A shift by 64 (depth 0)
// gives 0 in Go.
func (ix *keyIndex) segment(h uint64) *segment {
	return ix.dir[h>>(64-ix.depth)]
}

// Get returns key's id. The key is passed by pointer: a lookup's keys
// were usually just written, and copying each to the stack made the CPU
// wait for the stores.
func (ix *keyIndex) Get(k *chunk.Key) (arena.ID, bool) {
	h := ix.hash(k)
	s := ix.segment(h)
	i := h & s.mask
	// The keys alone, up to the longest distance the segment has had (see
	// keyIndex). An empty slot's id is 0, which no object has.
	for range s.far + 1 {
		if sl := &s.slots[i]; sl.key == *k && sl.id != 0 {
			return sl.id, true
		}
		i = (i + 1) & s.mask
	}
	return 0, false
}

// Has reports whether key is held.
func (ix *keyIndex) Has(k *chunk.Key) bool {
	_, ok := ix.Get(k)
	return ok
}

// Set stores id, which is not 0, under k, replacing an earlier id.
func (ix *keyIndex) Set(k chunk.Key, id arena.ID) {
	h := ix.hash(&k)
	if i, ok := ix.segment(h).find(&k, h); ok {
		ix.segment(h).slots[i].id = id
		return
	}
	ix.n++
	ix.add(islot{k, id}, h)
}

// add places e, absent from the index, whose hash is h.
func (ix *keyIndex) add(e islot, h uint64) {
	s := ix.segment(h)
	for (s.n+1)*4 > len(s.slots)*3 {
		if !ix.grow(s, h) {
			ix.rehash(e)
			return
		}
		s = ix.segment(h)
	}
	if e, ok := s.insert(e, h&s.mask); !ok {
		// A probe ran past maxDist: the segment holds every key but e (which
		// may be another key than the one added, displaced on the way).
		ix.rehash(e)
	}
}

// rehash draws fresh seeds and places every key again, and extra. A
// probe of maxDist does not happen with random hashes at a load of 3/4;
// should one happen, new seeds make other probes, where growing would
// split the same run again.
func (ix *keyIndex) rehash(extra islot) {
	all := make([]islot, 0, ix.n)
	ix.Range(func(k chunk.Key, id arena.ID) bool {
		all = append(all, islot{k, id})
		return true
	})
	all = append(all, extra)
	ix.reset()
	for _, e := range all {
		ix.add(e, ix.hash(&e.key))
	}
	ix.n = len(all) // after the loop: a rehash within it counted only part
}

// find returns the slot of k, whose hash is h.
func (s *segment) find(k *chunk.Key, h uint64) (uint64, bool) {
	i := h & s.mask
	for d := uint8(1); ; d++ {
		c := s.ctrl[i]
		if c < d {
			return 0, false
		}
		if c == d && s.slots[i].key == *k {
			return i, true
		}
		i = (i + 1) & s.mask
	}
}

// insert places e, absent from s, starting at its home slot i, taking the
// slot of any key nearer its own home (Robin Hood) and carrying that key
// on. It returns the carried entry and false when a distance would pass
// maxDist; s then holds every other key, consistently.
func (s *segment) insert(e islot, i uint64) (islot, bool) {
	d := uint8(1)
	for {
		c := s.ctrl[i]
		if c == 0 {
			s.ctrl[i], s.slots[i] = d, e
			s.n++
			s.far = max(s.far, d-1)
			return islot{}, true
		}
		if c < d {
			s.far = max(s.far, d-1)
			s.ctrl[i], d = d, c
			s.slots[i], e = e, s.slots[i]
		}
		if d == maxDist {
			return e, false
		}
		d++
		i = (i + 1) & s.mask
	}
}

// grow doubles s, or splits it in two once it has maxSegSlots; h is
// the hash of a key in s. It reports false, changing nothing, when a
// key could not be placed within maxDist of its home.
func (ix *keyIndex) grow(s *segment, h uint64) bool {
	if len(s.slots) < maxSegSlots {
		bigger := newSegment(2*len(s.slots), s.depth)
		if !ix.moveAll(s, bigger, bigger, 0) {
			return false
		}
		ix.replace(s, h, bigger, bigger)
		return true
	}
	left, right := newSegment(len(s.slots), s.depth+1), newSegment(len(s.slots), s.depth+1)
	if !ix.moveAll(s, left, right, uint64(1)<<(63-s.depth)) {
		return false
	}
	if s.depth == ix.depth {
		dir := make([]*segment, 2*len(ix.dir))
		for i, p := range ix.dir {
			dir[2*i], dir[2*i+1] = p, p
		}
		ix.dir, ix.depth = dir, ix.depth+1
	}
	ix.replace(s, h, left, right)
	return true
}

// moveAll copies every key of s into left, or into right when its hash
// has bit set, and reports false if one could not be placed.
func (ix *keyIndex) moveAll(s, left, right *segment, bit uint64) bool {
	for i, c := range s.ctrl {
		if c == 0 {
			continue
		}
		e := s.slots[i]
		h := ix.hash(&e.key)
		to := left
		if h&bit != 0 {
			to = right
		}
		if _, ok := to.insert(e, h&to.mask); !ok {
			return false
		}
	}
	return true
}

// replace points the directory entries of old, which holds hash h, at
// left (the first half of them) and right (the second).
func (ix *keyIndex) replace(old *segment, h uint64, left, right *segment) {
	span := uint64(1) << (ix.depth - old.depth) // entries old fills: an aligned block
	first := (h >> (64 - ix.depth)) &^ (span - 1)
	for j := range span {
		if j < span/2 || span == 1 {
			ix.dir[first+j] = left
		} else {
			ix.dir[first+j] = right
		}
	}
}

// Delete removes k and reports whether it was held.
func (ix *keyIndex) Delete(k *chunk.Key) bool {
	h := ix.hash(k)
	s := ix.segment(h)
	i, ok := s.find(k, h)
	if !ok {
		return false
	}
	// Shift the run after i back by one, each key a slot nearer its home,
	// until an empty slot or a key already at its home.
	for {
		j := (i + 1) & s.mask
		if s.ctrl[j] <= 1 {
			break
		}
		s.ctrl[i], s.slots[i] = s.ctrl[j]-1, s.slots[j]
		i = j
	}
	s.ctrl[i], s.slots[i] = 0, islot{}
	s.n--
	ix.n--
	return true
}

// Range calls fn for every key and its id until fn returns false. fn must
// not change the index.
func (ix *keyIndex) Range(fn func(chunk.Key, arena.ID) bool) {
	for j := 0; j < len(ix.dir); {
		s := ix.dir[j]
		for i, c := range s.ctrl {
			if c != 0 && !fn(s.slots[i].key, s.slots[i].id) {
				return
			}
		}
		j += 1 << (ix.depth - s.depth)
	}
}
