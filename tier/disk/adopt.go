package disk

import (
	"slices"

	"kvtier/chunk"
	"kvtier/tier/policy"
)

// A prefix-aware policy links a record to its parent only when the parent
// is tracked as the record is admitted. Two things admit a record before
// its parent: recovery, which admits records in log order while a
// chunk's record may lie before its parent's (the manager's writers
// store a prompt's chunks two at a time; a parent evicted and stored
// again is newer than its child), and a Put published before its
// parent's Put, which may still be writing, waiting for room, or not have
// come yet. Both are linked afterwards (policy.Adopter), so that the
// policy evicts the chain from its tail.

// maxWaitUp bounds the records waiting for their parent's record at run
// time (waitUps): a parent that never comes (not stored on this tier, or
// evicted) must not hold its children's keys for good. Past the bound the
// oldest noted wait is forgotten, and that child stays a root.
const maxWaitUp = 1024

// waitUps are the records published before their parent's record, by
// parent, in the order noted (FIFO, for the bound).
type waitUps struct {
	kids map[chunk.Key][]waitKid // by parent
	ring []waitRef               // the notes in order, maxWaitUp at most
	head int                     // oldest note in ring, once it is full
	seq  uint64
}

type waitKid struct {
	key chunk.Key
	seq uint64
}

type waitRef struct {
	up  chunk.Key
	seq uint64
}

// note notes that key waits for up's record.
func (w *waitUps) note(key, up chunk.Key) {
	if w.kids == nil {
		w.kids = make(map[chunk.Key][]waitKid)
	}
	w.seq++
	if len(w.ring) < maxWaitUp {
		w.ring = append(w.ring, waitRef{up: up, seq: w.seq})
	} else {
		old := w.ring[w.head]
		w.forget(old)
		w.ring[w.head] = waitRef{up: up, seq: w.seq}
		w.head = (w.head + 1) % maxWaitUp
	}
	w.kids[up] = append(w.kids[up], waitKid{key: key, seq: w.seq})
}

// forget drops the wait ref names, if it is still there.
func (w *waitUps) forget(ref waitRef) {
	kids, ok := w.kids[ref.up]
	if !ok {
		return
	}
	kids = slices.DeleteFunc(kids, func(k waitKid) bool { return k.seq == ref.seq })
	if len(kids) == 0 {
		delete(w.kids, ref.up)
		return
	}
	w.kids[ref.up] = kids
}

// take returns and forgets the records waiting for up.
func (w *waitUps) take(up chunk.Key) []waitKid {
	if len(w.kids) == 0 {
		return nil
	}
	kids, ok := w.kids[up]
	if ok {
		delete(w.kids, up)
	}
	return kids
}

// parentKey is the parent a restored record names.
func (r warmRec) parentKey() chunk.Key { return chunk.Key{Scope: r.key.Scope, Hash: r.up} }

// noteParent notes, as key is published with parent up, whether the link
// must wait: up's record is not live (being written, waiting for room, or
// not stored yet). A published record's children that waited for it are
// linked now.
func (x *index) noteParent(key chunk.Key, up parent) {
	if !x.chains {
		return
	}
	if up.ok && up.key.Scope == key.Scope {
		if _, ok := x.liveSlot(up.key); !ok {
			x.waitUp.note(key, up.key)
		}
	}
	for _, k := range x.waitUp.take(key) {
		x.adopt(k.key, key)
	}
}

// forgetWaiting drops the links waiting for key, whose write failed.
func (x *index) forgetWaiting(key chunk.Key) { x.waitUp.take(key) }

// noteRestored notes a record recovery found in the log with parent up,
// which the policy cannot link yet when up's record is not indexed.
func (x *index) noteRestored(key chunk.Key, up parent) {
	if !x.chains || !up.ok || up.key.Scope != key.Scope {
		return
	}
	if _, ok := x.liveSlot(up.key); !ok {
		x.relink = append(x.relink, warmRec{key: key, up: up.key.Hash, hasUp: true})
	}
}

// adoptRestored links the restored records that came before their
// parents, once the policy has every restored record. A parent that is
// not on disk leaves its child a root.
func (x *index) adoptRestored() {
	adoptAll(x.order, x.relink)
	x.relink = nil
}

// adoptAll links each of recs under its parent and returns those it could
// not link (a parent not tracked, among others). It walks recs from the
// end: Adopt walks from the parent up to its root, looking for a cycle,
// and records listed in log order tend to be each other's ancestors, so
// from the end each walk stops at the next root not linked yet instead of
// climbing the whole chain (the same links, in a fraction of the steps).
func adoptAll(order policy.Policy[chunk.Key], recs []warmRec) []warmRec {
	ad, ok := order.(policy.Adopter[chunk.Key])
	if !ok {
		return nil
	}
	var failed []warmRec
	for i := len(recs) - 1; i >= 0; i-- {
		if !ad.Adopt(recs[i].key, recs[i].parentKey()) {
			failed = append(failed, recs[i])
		}
	}
	slices.Reverse(failed)
	return failed
}

// adopt links key under its parent up, in the policy's queue while it
// warms.
func (x *index) adopt(key, up chunk.Key) {
	if x.warming() {
		x.warm.queued = append(x.warm.queued, polOp{kind: polAdopt, key: key, up: up, hasUp: true})
		return
	}
	if ad, ok := x.order.(policy.Adopter[chunk.Key]); ok {
		ad.Adopt(key, up)
	}
}
