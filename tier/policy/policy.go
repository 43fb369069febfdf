// Package policy holds kvtier's pluggable eviction policies: LRU, LFU, FIFO,
// MRU, S3-FIFO and ARC behind one small interface.
//
// A policy only orders keys; it never holds data and never decides when to
// evict. The owner (a tier) admits keys as it stores objects, reports hits
// and deletions, and when it needs room — by bytes, by its own rule — calls
// Evict until enough is free. Every object therefore counts as one, and the
// adaptive policies (S3-FIFO, ARC) size their queues from the current Len().
//
// Evict takes a busy predicate so the owner can protect pinned or leased
// objects: busy keys are skipped and keep their place and state, and Evict
// reports ok=false when nothing else is left. Evict walks past busy keys,
// so its cost grows with the number of pinned keys at the eviction end;
// pins are expected to be few and short-lived.
//
// The implementations keep their nodes in slice-backed arrays linked by
// int32 indices, with a map from key to index. There are no per-entry heap
// pointers for the garbage collector to scan, and released indices are
// reused, so steady-state operations do not allocate.
//
// Policies are not safe for concurrent use: the owner calls them under its
// own mutex.
package policy

import (
	"fmt"
	"strings"
)

// Policy orders the keys of one cache for eviction.
type Policy[K comparable] interface {
	// Name is the policy's canonical name, as listed by Names.
	Name() string
	// Admit records that k was just inserted. k was not tracked; admitting
	// a tracked key counts as an Access.
	Admit(k K)
	// Access records a hit on k. Untracked keys are ignored.
	Access(k K)
	// Remove forgets k because the owner deleted it (not an eviction): no
	// history of k is kept.
	Remove(k K)
	// Evict chooses the next victim, skipping keys for which busy(k) is
	// true, stops tracking it and returns it. ok is false when every
	// tracked key is busy or none is tracked. busy may be nil.
	Evict(busy func(K) bool) (k K, ok bool)
	// Len returns how many keys are tracked (history entries excluded).
	Len() int
}

// Canonical policy names.
const (
	LRU    = "LRU"
	LFU    = "LFU"
	FIFO   = "FIFO"
	MRU    = "MRU"
	S3FIFO = "S3FIFO"
	ARC    = "ARC"
	// The prefix-aware policies (tree.go).
	TREELRU  = "TREELRU"
	TREELFU  = "TREELFU"
	TREEHD   = "TREEHD"
	TREESLRU = "TREESLRU"
	TREERP   = "TREERP"
)

// Prefixed is implemented by the policies that use the prefix chain: a
// chunk is only worth keeping while every chunk before it in its prompt is
// kept, since a lookup stops at the first miss. The owner admits a chain's
// first key with Admit and every later one with AdmitChild, naming the key
// just before it. Keys' parents never change (chunk keys are chained
// hashes), so hits need no parent.
type Prefixed[K comparable] interface {
	Policy[K]
	// AdmitChild is Admit for a key whose parent in its prefix chain is
	// parent. An untracked parent makes k the root of a chain of its own.
	AdmitChild(k, parent K)
}

// AdmitAfter admits k to p, as the child of parent when p is Prefixed and
// hasParent is true, and as a plain Admit otherwise.
func AdmitAfter[K comparable](p Policy[K], k, parent K, hasParent bool) {
	if pp, ok := p.(Prefixed[K]); ok && hasParent {
		pp.AdmitChild(k, parent)
		return
	}
	p.Admit(k)
}

// Names lists the policies New accepts: the classic ones, LRU first, then
// the prefix-aware ones.
func Names() []string {
	return []string{LRU, LFU, FIFO, MRU, S3FIFO, ARC, TREELRU, TREELFU, TREEHD, TREESLRU, TREERP}
}

// Default is the policy of the tiers when configuration names none: the
// best across the traces of docs/bench.md ("Eviction policies").
const Default = TREELFU

// New returns an empty policy by name, case-insensitively. The empty name
// gives Default; "S3-FIFO" is accepted for S3FIFO.
func New[K comparable](name string) (Policy[K], error) {
	switch strings.ToUpper(strings.TrimSpace(name)) {
	case LRU:
		return newRecency[K](LRU), nil
	case MRU:
		return newRecency[K](MRU), nil
	case FIFO:
		return newRecency[K](FIFO), nil
	case LFU:
		return newLFU[K](), nil
	case S3FIFO, "S3-FIFO":
		return newS3FIFO[K](), nil
	case ARC:
		return newARC[K](), nil
	case TREELRU, "TREE-LRU":
		return newTree[K](TREELRU), nil
	case "", TREELFU, "TREE-LFU":
		return newTree[K](TREELFU), nil
	case TREESLRU, "TREE-SLRU":
		return newTree[K](TREESLRU), nil
	case TREERP, "TREE-RP":
		return newTree[K](TREERP), nil
	case TREEHD, "TREE-HD":
		return newTree[K](TREEHD), nil
	}
	return nil, fmt.Errorf("policy: unknown eviction policy %q (valid: %s)", name, strings.Join(Names(), ", "))
}

// Grower is implemented by policies that can make room for n tracked keys
// at once. An owner about to admit many keys (the disk tier restoring a
// checkpoint) calls it first: building a map of a million keys step by
// step rehashes it about twenty times.
type Grower interface {
	// Grow makes room for n more tracked keys. It only sizes the key map
	// while nothing is tracked (a map cannot grow in place); the slices
	// grow either way.
	Grow(n int)
}

// Grow calls p.Grow(n) when p is a Grower and n is positive.
func Grow[K comparable](p Policy[K], n int) {
	if g, ok := p.(Grower); ok && n > 0 {
		g.Grow(n)
	}
}

// Adopter is implemented by the prefix-aware policies, for an owner that
// may learn of a key before its parent: the disk tier restoring its
// records in log order, where a chunk's record can precede its parent's
// (two writers, or a parent stored again later).
type Adopter[K comparable] interface {
	Prefixed[K]
	// AdmitChildLinked is AdmitChild that reports whether k became
	// parent's child: false when parent is not tracked (k is then a
	// root) or k was tracked already.
	AdmitChildLinked(k, parent K) bool
	// Adopt makes the tracked root k a child of the tracked parent, as if
	// AdmitChild had named it. It reports whether it did: not when either
	// is untracked, k has a parent already, or parent descends from k
	// (which chained keys never do, but raw keys might).
	Adopt(k, parent K) bool
}
