package disk

import (
	"math/rand/v2"
	"slices"
	"unsafe"

	"github.com/zeebo/xxh3"

	"kvtier/chunk"
)

// keyTab maps a key to its slot in the index. It is a hash table of
// one-cache-line buckets that hold a 32-bit tag of each key's hash and the
// slot number, not the key: the key is compared in the slot, which the
// caller reads next anyway. Keys that do not fit their home bucket go to
// the next ones, and each bucket counts the entries that passed it, so a
// lookup stops at the first bucket nothing passed and a delete needs no
// tombstone.
//
// A Go map would do, but Open restores a million keys from a checkpoint,
// and a map takes them one random cache miss at a time (about half of
// Open's CPU at a million records, docs/scale.md). This table is filled
// in bucket order instead (fill): one pass over memory. Its size is 64
// bytes per bucket of up to 5.25 keys (a load of 0.75): 12.2 bytes per key
// when full, 24.4 just after doubling, 36.6 while the old table's keys move
// out, 12.2-24.4 after a fill (16.8 at a million keys); a map took 40 or so.
//
// It doubles when full, and moves the keys of the old table a few buckets
// per put rather than all at once: every tier operation waits while the
// table is changed, and a million keys take hundreds of milliseconds to
// rehash. Sizing it for the most records a tier could hold instead
// (capacity over the smallest record, 4 KiB) would spare it growing, but
// real records are megabytes: a 1 TiB tier would take 3 GiB of table for
// a few hundred thousand keys.
type keyTab struct {
	cur   ktable
	old   ktable // the table before the last doubling while its keys move to cur; nil b after
	moved int    // buckets of old already moved
	n     int    // keys held, in cur and old
	max   int    // keys it holds before cur doubles
	seed  uint64 // the hash's: keys come from clients
}

// ktable is one array of buckets.
type ktable struct {
	b     []kbucket
	shift uint // 64 - log2(len(b)): a hash's top bits choose its home bucket
}

const kways = 7

// kbucket is 64 bytes: one cache line.
type kbucket struct {
	tag  [kways]uint32 // 0: empty
	slot [kways]int32
	over uint32 // entries whose home bucket lies before this one and that lie past it
	_    uint32
}

// maxLoad is the share of entries a table fills before it doubles.
const maxLoad = 0.75

// movePerPut is how many buckets of the old table each put moves. One
// would do: a table that doubled at n keys doubles again after n more
// puts, and the old table has n/5.25 buckets.
const movePerPut = 2

func newKeyTab(n int) keyTab {
	t := keyTab{seed: rand.Uint64()}
	t.alloc(n)
	return t
}

// alloc gives t room for n keys, empty.
func (t *keyTab) alloc(n int) {
	nb := 8
	for float64(nb*kways)*maxLoad < float64(n) {
		nb *= 2
	}
	t.allocBuckets(nb)
	t.n = 0
}

// allocBuckets makes cur an empty table of nb buckets, a power of two.
func (t *keyTab) allocBuckets(nb int) {
	t.cur = ktable{b: make([]kbucket, nb), shift: uint(64 - bitsOf(nb))}
	t.max = int(float64(nb*kways) * maxLoad)
}

func bitsOf(pow2 int) int {
	n := 0
	for 1<<n < pow2 {
		n++
	}
	return n
}

func (t *keyTab) hash(k *chunk.Key) uint64 {
	return xxh3.HashSeed(unsafe.Slice((*byte)(unsafe.Pointer(k)), unsafe.Sizeof(*k)), t.seed)
}

// tagOf is the part of h a bucket keeps: never 0, and not the top bits,
// which all keys of a bucket share.
func tagOf(h uint64) uint32 { return uint32(h) | 1 }

// get returns the slot of k among slots.
func (t *keyTab) get(k chunk.Key, slots []slot) (int32, bool) {
	h := t.hash(&k)
	if i, ok := t.cur.get(h, k, slots); ok {
		return i, true
	}
	if t.old.b != nil {
		return t.old.get(h, k, slots)
	}
	return 0, false
}

func (kt *ktable) get(h uint64, k chunk.Key, slots []slot) (int32, bool) {
	tag, mask := tagOf(h), len(kt.b)-1
	for b := int(h >> kt.shift); ; b = (b + 1) & mask {
		bk := &kt.b[b]
		for w := range kways {
			if bk.tag[w] == tag && slots[bk.slot[w]].key == k {
				return bk.slot[w], true
			}
		}
		if bk.over == 0 {
			return 0, false
		}
	}
}

// put adds k, which t does not hold, at slot i. Every slot t holds must
// name its key: moving keys rehashes them.
func (t *keyTab) put(k chunk.Key, i int32, slots []slot) {
	if t.old.b != nil {
		t.move(movePerPut, slots)
	}
	if t.n == t.max {
		t.grow(slots)
	}
	t.cur.insert(t.hash(&k), i)
	t.n++
}

func (kt *ktable) insert(h uint64, i int32) {
	mask := len(kt.b) - 1
	for b := int(h >> kt.shift); ; b = (b + 1) & mask {
		bk := &kt.b[b]
		for w := range kways {
			if bk.tag[w] == 0 {
				bk.tag[w], bk.slot[w] = tagOf(h), i
				return
			}
		}
		bk.over++
	}
}

// del removes k, which t holds at slot i. It matches the slot, not the
// key: the caller may have cleared the slot already.
func (t *keyTab) del(k chunk.Key, i int32) {
	h := t.hash(&k)
	if t.cur.del(h, i) || (t.old.b != nil && t.old.del(h, i)) {
		t.n--
	}
}

func (kt *ktable) del(h uint64, i int32) bool {
	tag, mask := tagOf(h), len(kt.b)-1
	home := int(h >> kt.shift)
	for b := home; ; b = (b + 1) & mask {
		bk := &kt.b[b]
		for w := range kways {
			if bk.tag[w] == tag && bk.slot[w] == i {
				bk.tag[w], bk.slot[w] = 0, 0
				for p := home; p != b; p = (p + 1) & mask {
					kt.b[p].over--
				}
				return true
			}
		}
		if bk.over == 0 {
			return false
		}
	}
}

// grow doubles the table. The keys stay in the old one until puts move
// them (move); a lookup looks in both.
func (t *keyTab) grow(slots []slot) {
	if t.old.b != nil { // not reached: puts move the old table out faster than they fill the new one
		t.move(len(t.old.b), slots)
	}
	t.old, t.moved = t.cur, 0
	t.allocBuckets(2 * len(t.old.b))
}

// move moves the keys of up to nb more buckets of the old table to cur,
// and drops the old table once it is empty. The counts of entries passing
// old buckets are left as they are: too high a count only makes a lookup
// of the old table look one bucket further.
func (t *keyTab) move(nb int, slots []slot) {
	end := min(t.moved+nb, len(t.old.b))
	for b := t.moved; b < end; b++ {
		bk := &t.old.b[b]
		for w := range kways {
			if bk.tag[w] != 0 {
				s := bk.slot[w]
				t.cur.insert(t.hash(&slots[s].key), s)
				bk.tag[w], bk.slot[w] = 0, 0
			}
		}
	}
	t.moved = end
	if end == len(t.old.b) {
		t.old = ktable{}
	}
}

// fill builds t, empty, from the live slots first..len(slots)-1 in bucket
// order: one pass over the table's memory instead of a cache miss per key.
// It reports a key found in two slots (then t is not usable).
func (t *keyTab) fill(slots []slot, first int) (dup bool) {
	n := len(slots) - first
	if n > t.max {
		t.alloc(n)
	}
	t.n = 0
	hs := make([]hashed, n)
	for j := range hs {
		hs[j] = hashed{h: t.hash(&slots[first+j].key), slot: int32(first + j)}
	}
	radixSort(hs)
	for j, e := range hs {
		if j > 0 && hs[j-1].h == e.h && slots[hs[j-1].slot].key == slots[e.slot].key {
			return true
		}
		t.cur.insert(e.h, e.slot)
		t.n++
	}
	return false
}

// hashed is a key's hash and its slot.
type hashed struct {
	h    uint64
	slot int32
}

// radixSort sorts hs by hash: scattered into 2048 runs by the top 11 bits
// (2048 write streams stay in the caches), then each run sorted.
func radixSort(hs []hashed) {
	const bits = 11
	var start [1<<bits + 1]int
	for _, e := range hs {
		start[e.h>>(64-bits)+1]++
	}
	for i := 1; i < len(start); i++ {
		start[i] += start[i-1]
	}
	out := make([]hashed, len(hs))
	next := start
	for _, e := range hs {
		p := e.h >> (64 - bits)
		out[next[p]] = e
		next[p]++
	}
	for i := range 1 << bits {
		slices.SortFunc(out[start[i]:start[i+1]], func(a, b hashed) int { return cmpU64(a.h, b.h) })
	}
	copy(hs, out)
}
