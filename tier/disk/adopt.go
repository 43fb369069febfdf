package disk

import (
	"kvtier/chunk"
	"kvtier/tier/policy"
)

// A prefix-aware policy links a record to its parent only when the parent
// is tracked as the record is admitted. Two things admit a record before
// its parent: recovery, which admits records in log order while a
// chunk's record may lie before its parent's (the manager's writers
// store a prompt's chunks two at a time; a parent evicted and stored
// again is newer than its child), and a Put whose parent's record is
// still being written by another writer. Both are linked afterwards
// (policy.Adopter), so that the policy evicts the chain from its tail.

// upLink is a record waiting for its parent's record to be published.
type upLink struct {
	key, up chunk.Key
}

// parentKey is the parent a restored record names.
func (r warmRec) parentKey() chunk.Key { return chunk.Key{Scope: r.key.Scope, Hash: r.up} }

// noteParent notes, as key is published with parent up, whether the
// link must wait: up's record is being written. A published record's
// children that waited for it are linked now.
func (x *index) noteParent(key chunk.Key, up parent) {
	if up.ok {
		if j, ok := x.keys.get(up.key, x.slots); ok && x.slots[j].state == slotWriting {
			x.waitUp = append(x.waitUp, upLink{key: key, up: up.key})
		}
	}
	if len(x.waitUp) == 0 {
		return
	}
	n := 0
	for _, w := range x.waitUp {
		if w.up == key {
			x.adopt(w.key, key)
			continue
		}
		x.waitUp[n] = w
		n++
	}
	x.waitUp = x.waitUp[:n]
}

// forgetWaiting drops the links waiting for key, whose write failed.
func (x *index) forgetWaiting(key chunk.Key) {
	n := 0
	for _, w := range x.waitUp {
		if w.up != key {
			x.waitUp[n] = w
			n++
		}
	}
	x.waitUp = x.waitUp[:n]
}

// noteRestored notes a record recovery found in the log with parent up,
// which the policy cannot link yet when up's record is not indexed.
func (x *index) noteRestored(key chunk.Key, up parent) {
	if !up.ok || up.key.Scope != key.Scope {
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
	if ad, ok := x.order.(policy.Adopter[chunk.Key]); ok {
		for _, r := range x.relink {
			ad.Adopt(r.key, r.parentKey())
		}
	}
	x.relink = nil
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
