package policy

import "math/bits"

// hitDensity learns, for each class of leaf and each age, how many hits a
// leaf of that class and age can still expect per unit of cache time it
// will still occupy, and ranks leaves by it (Least Hit Density, Beckmann
// et al., NSDI 2018, applied to the leaves of the prefix forest).
//
// Age is clock ticks (admissions plus hits) since the leaf's last use. A
// leaf's class is its hit count (0, 1, 2, 3 or more) and whether it ever
// had a child: a prompt's last chunk never had one and is almost never
// reused (the next turn of a conversation diverges there), while the chunk
// before it is what the next turn finds.
//
// Every hit on a key and every eviction of a leaf is counted at its age in its
// class. Every hdPeriod events the densities are recomputed from the
// counts, walking ages downwards: of the leaves that reached age a, the
// hits they went on to get over the time they went on to stay. The counts
// then decay, so the table follows a workload that changes. The reuse of
// prefixes is far from memoryless: the next turn of a chat comes tens of
// seconds after the answer, rarely sooner, and a cache that evicts by
// recency throws conversations out just before they return. Learning the
// density by age is what lets this policy hold them.
type hitDensity struct {
	counts [hdClasses][hdAges][2]float32 // hits, evictions
	table  [hdClasses][hdAges]float32
	events int
}

const (
	hdClasses = 8
	hdAges    = 16 + 4*59 // see ageBucket
	hdPeriod  = 1 << 13
	hdDecay   = 0.9
)

// ageBucket maps an age to its bucket: exact below 16, then four buckets
// per doubling.
func ageBucket(age uint64) int {
	if age < 16 {
		return int(age)
	}
	b := bits.Len64(age) // >= 5
	return min(16+(b-5)*4+int(age>>(b-3)&3), hdAges-1)
}

// bucketWidth is how many ages bucket b covers.
func bucketWidth(b int) float32 {
	if b < 16 {
		return 1
	}
	return float32(uint64(1) << ((b-16)/4 + 2))
}

func hdClass(nd *tnode) int { return classOf(nd.hits, nd.hadChild) }

func classOf(hits uint16, hadChild bool) int {
	c := int(min(hits, 3))
	if hadChild {
		c += 4
	}
	return c
}

// init seeds the table so that, before anything is learnt, older leaves go
// first and leaves that never had a child go before those that had.
func (h *hitDensity) init() {
	for c := range hdClasses {
		for a := range hdAges {
			h.table[c][a] = float32(1+c) / float32(1+a)
		}
	}
}

func (h *hitDensity) density(hits uint16, hadChild bool, last, now uint64) float64 {
	return float64(h.table[classOf(hits, hadChild)][ageBucket(now-last)])
}

func (h *hitDensity) hit(nd *tnode, now uint64) { h.count(nd, now, 0) }

// returned moves the eviction counted for a key that has come back to a
// hit at the age it has now: had it stayed, that is when it would have
// been hit. (The eviction may have decayed meanwhile; the count stays
// non-negative.)
func (h *hitDensity) returned(hits uint16, hadChild bool, last, gone, now uint64) {
	c := classOf(hits, hadChild)
	e := &h.counts[c][ageBucket(gone-last)][1]
	*e = max(0, *e-1)
	h.counts[c][ageBucket(now-last)][0]++
}
func (h *hitDensity) evicted(nd *tnode, now uint64) { h.count(nd, now, 1) }

func (h *hitDensity) count(nd *tnode, now uint64, what int) {
	h.counts[hdClass(nd)][ageBucket(now-nd.last)][what]++
	if h.events++; h.events >= hdPeriod {
		h.events = 0
		h.recompute()
	}
}

// recompute derives the densities from the counts and decays the counts.
func (h *hitDensity) recompute() {
	for c := range hdClasses {
		var hitsAbove, eventsAbove, lifetime float32
		for a := hdAges - 1; a >= 0; a-- {
			hits, evictions := h.counts[c][a][0], h.counts[c][a][1]
			hitsAbove += hits
			eventsAbove += hits + evictions
			lifetime += eventsAbove * bucketWidth(a)
			h.table[c][a] = 0 // nothing seen this old: no hit to expect
			if lifetime > 0 {
				h.table[c][a] = hitsAbove / lifetime
			}
			h.counts[c][a][0] *= hdDecay
			h.counts[c][a][1] *= hdDecay
		}
	}
}
