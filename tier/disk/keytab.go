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
// in bucket order instead (fill): one pass over memory. It also takes 16
// bytes per key at most against a map's 40 or so.
type keyTab struct {
	b     []kbucket
	shift uint   // 64 - log2(len(b)): a hash's top bits choose its home bucket
	n     int    // keys held
	max   int    // keys it holds before it doubles
	seed  uint64 // the hash's: keys come from clients
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
	t.b = make([]kbucket, nb)
	t.shift = uint(64 - bitsOf(nb))
	t.n, t.max = 0, int(float64(nb*kways)*maxLoad)
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
	tag, mask := tagOf(h), len(t.b)-1
	for b := int(h >> t.shift); ; b = (b + 1) & mask {
		bk := &t.b[b]
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

// put adds k, which t does not hold, at slot i.
func (t *keyTab) put(k chunk.Key, i int32, slots []slot) {
	if t.n == t.max {
		t.grow(slots)
	}
	t.insert(t.hash(&k), i)
}

func (t *keyTab) insert(h uint64, i int32) {
	mask := len(t.b) - 1
	for b := int(h >> t.shift); ; b = (b + 1) & mask {
		bk := &t.b[b]
		for w := range kways {
			if bk.tag[w] == 0 {
				bk.tag[w], bk.slot[w] = tagOf(h), i
				t.n++
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
	tag, mask := tagOf(h), len(t.b)-1
	home := int(h >> t.shift)
	for b := home; ; b = (b + 1) & mask {
		bk := &t.b[b]
		for w := range kways {
			if bk.tag[w] == tag && bk.slot[w] == i {
				bk.tag[w], bk.slot[w] = 0, 0
				for p := home; p != b; p = (p + 1) & mask {
					t.b[p].over--
				}
				t.n--
				return
			}
		}
		if bk.over == 0 {
			return
		}
	}
}

// grow doubles the table, taking the keys from their slots.
func (t *keyTab) grow(slots []slot) {
	old := t.b
	t.alloc(2 * len(old) * kways)
	for i := range old {
		for w := range kways {
			if old[i].tag[w] != 0 {
				s := old[i].slot[w]
				t.insert(t.hash(&slots[s].key), s)
			}
		}
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
	hs := make([]hashed, n)
	for j := range hs {
		hs[j] = hashed{h: t.hash(&slots[first+j].key), slot: int32(first + j)}
	}
	radixSort(hs)
	for j, e := range hs {
		if j > 0 && hs[j-1].h == e.h && slots[hs[j-1].slot].key == slots[e.slot].key {
			return true
		}
		t.insert(e.h, e.slot)
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
