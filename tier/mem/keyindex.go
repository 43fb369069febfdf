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
// Layout. A directory of segments, chosen by the top bits of a hash seeded
// per index (extendible hashing); each segment is a Robin Hood table with
// linear probing, homed by a window of the slot hash (see hash) that the
// segment chooses (its rotation, drawn at random when it is made). A
// segment doubles up to maxSegSlots and then splits in two, and a probe
// that runs too long draws a new rotation for that segment alone, so no
// change rebuilds more than one segment (at most maxSegSlots slots) under
// the tier's write lock, which lookups wait for: tens of microseconds, not
// a rehash of millions of keys.
//
// Robin Hood keeps each key's distance from its home in a byte (ctrl)
// and keeps the distances short and even (an insert takes the slot of a
// key nearer its own home); a delete shifts the following run back, so
// there are no tombstones. A lookup compares keys from the home slot and
// stops at the first slot whose key sits nearer its home than the probe
// has come (no key further on can be the one sought), and at the longest
// distance the segment has had (far, which only grows: about 6–10 on
// average with random keys after churn, up to 17 seen, at most
// maxDist-1). A hit at its home compares keys only and mostly costs one
// cache line of slots; a miss reads ctrl from the first mismatch, usually
// one more line, and stops within a slot or two.
//
// Hashing. Key kind 1 lets a client choose the chunk hashes it stores, so
// the slot must not follow from them alone: the directory and slot hashes
// mix all 16 bytes of the chunk hash and the scope with random seeds, and a client cannot
// aim collisions at a slot it cannot compute. A probe longer than maxDist
// (not seen with random hashes at a load of 3/4) makes its segment draw a
// new rotation, which homes its keys by other bits of the slot hash; after
// maxReseeds of them the segment grows (doubles or splits, either of which
// lowers its load), and a key that still finds no slot — possible only for
// keys that share the slot hash, which needs the index's seeds — goes to a
// short list (spill) that misses then scan. Every step is bounded: nothing
// loops on bad luck. (A rotation rather than a multiply by per-segment
// seeds: a multiply after the segment is loaded made a hit about 2 ns
// slower.)
//
// Memory: 33 bytes per slot (the 24-byte key, the 8-byte id, the
// distance byte). A segment grows before its load passes 3/4 and doubles
// or splits to 3/8, but never shrinks or merges (as a Go map does not):
// after deletes, or under churn that splits segments at a constant count,
// the bytes per key follow the peak, not the count (44–88 bytes per key
// while the table only grows). Clear of every scope resets it.
type keyIndex struct {
	dir   []*segment // 1 << depth entries; a segment of local depth d fills 1 << (depth-d) of them
	depth uint       // global depth: the hash's top depth bits choose the directory entry
	n     int
	seed  [4]uint64
	spill []islot // keys no segment could place (see add); empty but for hashes aimed with the seeds
}

// segment is one Robin Hood table. ctrl[i] is 0 for an empty slot, else
// 1 + the distance of slots[i] from its home. The fields a lookup reads
// come first, within one cache line.
type segment struct {
	mask    uint64
	slots   []islot
	ctrl    []uint8
	rot     uint8 // homes are the slot hash rotated left by rot, masked; drawn when the segment is made or rebuilt
	far     uint8 // the longest distance of a key from its home since the segment was made
	reseeds uint8 // rebuilds with a new rotation at this size
	depth   uint  // local depth: how many top hash bits all its keys share
	n       int
}

type islot struct {
	key chunk.Key
	id  arena.ID
}

// The sizes and bounds, variables so that tests can shrink them and reach
// splits, reseeds and the spill list with a few keys.
//
// maxReseeds stays well below 64: a segment's rotations are 64.
var (
	minSegSlots = 8
	maxSegSlots = 1024 // a split rehashes at most 768 keys
	// maxDist is the largest distance plus one (ctrl value) a segment
	// accepts; an insert that needs more rebuilds the segment. At most 255.
	maxDist uint8 = 64
	// maxReseeds is how many times a segment of one size draws new seeds
	// before it grows instead.
	maxReseeds uint8 = 3
)

func newKeyIndex() *keyIndex {
	ix := &keyIndex{}
	ix.reset()
	return ix
}

// reset empties the index and draws fresh seeds.
func (ix *keyIndex) reset() {
	// Any seeds do: for some keys a factor in hash is 0 or 1 (the first
	// hash word equal to seed[0], the scope equal to seed[3] or to
	// seed[3]^1) and the product drops or passes through the other words,
	// but finding such keys needs the seeds; the slot hash adds x back
	// multiplied by an odd constant, so such a scope's keys still get
	// homes that differ with x.
	for i := range ix.seed {
		ix.seed[i] = rand.Uint64()
	}
	ix.dir = []*segment{newSegment(minSegSlots, 0)}
	ix.depth = 0
	ix.n = 0
	ix.spill = nil
}

func newSegment(slots int, depth uint) *segment {
	return &segment{depth: depth, mask: uint64(slots - 1), rot: uint8(rand.Uint32N(64)),
		ctrl: make([]uint8, slots), slots: make([]islot, slots)}
}

// Len returns the number of keys held.
func (ix *keyIndex) Len() int { return ix.n }

// hash mixes the key with the index's seeds: a multiply-fold of the two
// halves of the chunk hash (x), then of that with the scope (g). g's top
// bits choose the directory entry; a window of y = g^(x·slotMix) homes
// the key in its segment (home): g's top bits are the same for all of a
// segment's keys, x's are not, and y still varies with x where a factor of
// 0 or 1 makes g 0 or x^seed[2] (a plain g^x would then be the same for
// every key of the scope). Get has its own copy.
func (ix *keyIndex) hash(k *chunk.Key) (g, y uint64) {
	lo := binary.LittleEndian.Uint64(k.Hash[0:8])
	hi := binary.LittleEndian.Uint64(k.Hash[8:16])
	a, b := bits.Mul64(lo^ix.seed[0], hi^ix.seed[1])
	x := a ^ b
	c, d := bits.Mul64(x^ix.seed[2], k.Scope^ix.seed[3])
	return c ^ d, c ^ d ^ x*slotMix
}

// slotMix is an odd constant (2^64 over the golden ratio) that x is
// multiplied by in the slot hash, so that no linear relation between g
// and x cancels it.
const slotMix = 0x9e3779b97f4a7c15

// home returns the home slot in s of a key whose slot hash is y.
func (s *segment) home(y uint64) uint64 {
	return bits.RotateLeft64(y, int(s.rot)) & s.mask
}

// segment returns the segment holding hash g. A shift by 64 (depth 0)
// gives 0 in Go.
func (ix *keyIndex) segment(g uint64) *segment {
	return ix.dir[g>>(64-ix.depth)]
}

// Get returns key's id. The key is passed by pointer: a lookup's keys
// were usually just written, and copying each to the stack made the CPU
// wait for the stores.
func (ix *keyIndex) Get(k *chunk.Key) (arena.ID, bool) {
	// hash, written out: with two results it is past the inliner's
	// budget, and the call cost a hit 2 ns.
	lo := binary.LittleEndian.Uint64(k.Hash[0:8])
	hi := binary.LittleEndian.Uint64(k.Hash[8:16])
	a, b := bits.Mul64(lo^ix.seed[0], hi^ix.seed[1])
	x := a ^ b
	c, d := bits.Mul64(x^ix.seed[2], k.Scope^ix.seed[3])
	g := c ^ d
	s := ix.segment(g)
	i := s.home(g ^ x*slotMix)
	// Keys first (a hit reads no ctrl); after a mismatch, stop where the
	// slot is empty or its key nearer its home than d (Robin Hood: k would
	// have taken that slot), or past the longest distance the segment has
	// had. An empty slot's id is 0, which no object has.
	for d := uint8(1); ; d++ {
		if sl := &s.slots[i]; sl.key == *k && sl.id != 0 {
			return sl.id, true
		}
		if s.ctrl[i] < d || d > s.far {
			break
		}
		i = (i + 1) & s.mask
	}
	if len(ix.spill) != 0 {
		return ix.spilled(k)
	}
	return 0, false
}

// spilled looks k up in the spill list.
func (ix *keyIndex) spilled(k *chunk.Key) (arena.ID, bool) {
	for _, e := range ix.spill {
		if e.key == *k {
			return e.id, true
		}
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
	g, y := ix.hash(&k)
	s := ix.segment(g)
	if i, ok := s.find(&k, s.home(y)); ok {
		s.slots[i].id = id
		return
	}
	for j := range ix.spill {
		if ix.spill[j].key == k {
			ix.spill[j].id = id
			return
		}
	}
	ix.n++
	ix.add(islot{k, id})
}

// add places e, absent from the index. It grows e's segment while an
// insert would pass a load of 3/4; when a probe runs past maxDist it
// rebuilds the segment with new seeds, at most maxReseeds times at one
// size, then grows it, and as a last resort puts the key in ix.spill.
// Each round either places a key, or spends one of a segment's bounded
// reseeds, or grows a segment (which bounds reseeds again), so add ends.
func (ix *keyIndex) add(e islot) {
	for {
		g, y := ix.hash(&e.key)
		s := ix.segment(g)
		if (s.n+1)*4 > len(s.slots)*3 {
			if !ix.grow(s, g) {
				ix.spill = append(ix.spill, e)
				return
			}
			continue
		}
		carried, ok := s.insert(e, s.home(y))
		if ok {
			return
		}
		// A probe ran past maxDist: s holds every key but carried (which
		// may be another key than e, displaced on the way).
		e = carried
		if s.reseeds < maxReseeds {
			ix.rebuild(s, g)
		} else if !ix.grow(s, g) {
			ix.spill = append(ix.spill, e)
			return
		}
	}
}

// find returns the slot of k in s, whose home there is i.
func (s *segment) find(k *chunk.Key, i uint64) (uint64, bool) {
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
		if d >= maxDist {
			return e, false
		}
		d++
		i = (i + 1) & s.mask
	}
}

// rebuild replaces s, which holds hash g, by a segment of the same size
// and a new rotation, one reseed further. Keys it cannot place go back
// through add (bounded: see add).
func (ix *keyIndex) rebuild(s *segment, g uint64) {
	to := newSegment(len(s.slots), s.depth)
	for to.rot == s.rot {
		to.rot = uint8(rand.Uint32N(64))
	}
	to.reseeds = s.reseeds + 1
	left := ix.moveAll(s, to, to, 0)
	ix.replace(s, g, to, to)
	ix.readd(left)
}

// grow doubles s, or splits it in two once it has maxSegSlots; g is the
// hash of a key in s. Either lowers the load of the segments the keys are
// in. It reports false, changing nothing, when a split would leave every
// key on one side (keys that share the directory hash's bits down to
// there, which needs the index's seeds to find).
func (ix *keyIndex) grow(s *segment, g uint64) bool {
	if len(s.slots) < maxSegSlots {
		bigger := newSegment(2*len(s.slots), s.depth)
		left := ix.moveAll(s, bigger, bigger, 0)
		ix.replace(s, g, bigger, bigger)
		ix.readd(left)
		return true
	}
	bit := uint64(1) << (63 - s.depth)
	right := 0
	for i, c := range s.ctrl {
		if c != 0 {
			if h, _ := ix.hash(&s.slots[i].key); h&bit != 0 {
				right++
			}
		}
	}
	if s.depth == 63 || right == 0 || right == s.n {
		return false
	}
	l, r := newSegment(len(s.slots), s.depth+1), newSegment(len(s.slots), s.depth+1)
	left := ix.moveAll(s, l, r, bit)
	if s.depth == ix.depth {
		dir := make([]*segment, 2*len(ix.dir))
		for i, p := range ix.dir {
			dir[2*i], dir[2*i+1] = p, p
		}
		ix.dir, ix.depth = dir, ix.depth+1
	}
	ix.replace(s, g, l, r)
	ix.readd(left)
	return true
}

// moveAll copies every key of s into left, or into right when its hash
// has bit set, and returns the keys it could not place (nil but when a
// probe passed maxDist).
func (ix *keyIndex) moveAll(s, left, right *segment, bit uint64) []islot {
	var out []islot
	for i, c := range s.ctrl {
		if c == 0 {
			continue
		}
		e := s.slots[i]
		g, y := ix.hash(&e.key)
		to := left
		if g&bit != 0 {
			to = right
		}
		if e, ok := to.insert(e, to.home(y)); !ok {
			out = append(out, e)
		}
	}
	return out
}

// readd places keys that a rebuild or a growth could not place, once
// the directory points at the new segments.
func (ix *keyIndex) readd(left []islot) {
	for _, e := range left {
		ix.add(e)
	}
}

// replace points the directory entries of old, which holds hash g, at
// left (the first half of them) and right (the second).
func (ix *keyIndex) replace(old *segment, g uint64, left, right *segment) {
	span := uint64(1) << (ix.depth - old.depth) // entries old fills: an aligned block
	first := (g >> (64 - ix.depth)) &^ (span - 1)
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
	g, y := ix.hash(k)
	s := ix.segment(g)
	i, ok := s.find(k, s.home(y))
	if !ok {
		return ix.unspill(k)
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

// unspill removes k from the spill list and reports whether it was there.
func (ix *keyIndex) unspill(k *chunk.Key) bool {
	for j := range ix.spill {
		if ix.spill[j].key == *k {
			last := len(ix.spill) - 1
			ix.spill[j] = ix.spill[last]
			ix.spill = ix.spill[:last]
			ix.n--
			return true
		}
	}
	return false
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
	for _, e := range ix.spill {
		if !fn(e.key, e.id) {
			return
		}
	}
}
