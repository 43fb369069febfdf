package engine

import (
	"context"
	"slices"

	"kvtier/arena"
	"kvtier/chunk"
)

// References held across requests for prefill/decode transfers (see
// docs/disaggregation.md): a producer keeps the chunks it was asked to push resident
// until they are sent, a consumer keeps the chunks pushed to it resident
// until they are read. Both are plain arena references, so the chunks are
// ordinary RAM chunks that eviction skips while held.

// Refs is an ordered queue of references on RAM chunks. It is not safe
// for concurrent use; its slices are reused, so a steady flow of chunks
// allocates nothing once warm.
type Refs struct {
	e   *Engine
	ids []arena.ID
	one [1]chunk.Key // AcquireRAMKey's argument, here so that it does not escape per call
}

// AcquireLocal appends references on the leading keys held in RAM or a
// node-local tier (promoting the latter into RAM) and returns how many it
// added.
func (r *Refs) AcquireLocal(ctx context.Context, e *Engine, keys []chunk.Key) (int, error) {
	r.e = e
	base := len(r.ids)
	r.ids = slices.Grow(r.ids, len(keys))[:base+len(keys)]
	n, err := e.mgr.AcquireLocal(ctx, keys, r.ids[base:])
	r.ids = r.ids[:base+n]
	return n, err
}

// Len returns how many references r holds.
func (r *Refs) Len() int { return len(r.ids) }

// Bytes returns the bytes of the j-th chunk, valid while it is held.
func (r *Refs) Bytes(j int) []byte { return r.e.arenaOf().Bytes(r.ids[j]) }

// DropFront releases the first n references.
func (r *Refs) DropFront(n int) {
	a := r.e.arenaOf()
	for _, id := range r.ids[:n] {
		a.Unref(id)
	}
	r.ids = r.ids[:copy(r.ids, r.ids[n:])]
}

// Release releases every reference.
func (r *Refs) Release() {
	if r.e != nil {
		r.DropFront(len(r.ids))
	}
}

// AcquireRAM appends references on the leading keys held in RAM, without
// promoting anything from a lower tier, and returns how many it added.
func (r *Refs) AcquireRAM(e *Engine, keys []chunk.Key) int {
	r.e = e
	base := len(r.ids)
	r.ids = slices.Grow(r.ids, len(keys))[:base+len(keys)]
	n := e.mgr.RAM().Acquire(keys, r.ids[base:])
	r.ids = r.ids[:base+n]
	return n
}

// AcquireRAMKey is AcquireRAM of one key, and reports whether it held it.
func (r *Refs) AcquireRAMKey(e *Engine, key chunk.Key) bool {
	r.one[0] = key
	return r.AcquireRAM(e, r.one[:]) == 1
}

// Detach appends r's references to dst as Held values and empties r
// without releasing them: each is then released with Unhold.
func (r *Refs) Detach(dst []Held) []Held {
	for _, id := range r.ids {
		dst = append(dst, Held{id})
	}
	r.ids = r.ids[:0]
	return dst
}

// Held is one reference on a RAM chunk, from Refs.Detach.
type Held struct{ id arena.ID }

// Unhold releases a reference from Refs.Detach.
func (e *Engine) Unhold(h Held) { e.arenaOf().Unref(h.id) }

// CommitHeld is Writes.Commit that also keeps a reference on each chunk
// it makes visible, taken before Commit drops the batch's own, so that no
// store in between can evict the chunk before it is held. A key whose
// chunk was in RAM already is held on the object there, if it still is.
// A key the batch skipped (Writes.Skip) is held on the object in RAM, if
// it still is. It appends one Held per key to dst for the leading keys it
// holds and returns how many those are; the batch is empty afterwards.
func (w *Writes) CommitHeld(dst []Held) ([]Held, int, error) {
	a := w.e.arenaOf()
	for _, id := range w.ids {
		if id != 0 {
			a.Ref(id) // the caller's hold, beside the batch's reference
		}
	}
	keys, ids := w.keys, w.ids
	err := w.commit()
	w.keys, w.ids = w.keys[:0], w.ids[:0]
	n := 0
	for i, id := range ids {
		if id == 0 {
			if err == nil && n == i && w.heldInRAM(keys[i], &dst) {
				n++
			}
			continue
		}
		if err == nil && n == i && w.heldVisible(a, keys[i], id, &dst) {
			n++
			continue
		}
		a.Unref(id)
	}
	return dst, n, err
}

// heldInRAM holds the object stored under key in RAM, if there is one,
// appending the hold to dst.
func (w *Writes) heldInRAM(key chunk.Key, dst *[]Held) bool {
	var one [1]arena.ID
	if w.e.mgr.RAM().Acquire([]chunk.Key{key}, one[:]) != 1 {
		return false
	}
	*dst = append(*dst, Held{one[0]})
	return true
}

// heldVisible reports whether key's chunk can be held: id, referenced
// by the caller, when Commit indexed it (the RAM tier's reference makes
// it not the only one: nothing else knows an unindexed reservation), else
// the object already stored under key. It appends the hold to dst.
func (w *Writes) heldVisible(a *arena.Arena, key chunk.Key, id arena.ID, dst *[]Held) bool {
	if a.Refs(id) > 1 {
		*dst = append(*dst, Held{id})
		return true
	}
	if !w.heldInRAM(key, dst) {
		return false
	}
	a.Unref(id)
	return true
}

// Splice moves src's references to the end of r, in order, and empties
// src: a caller acquires into a scratch Refs outside its lock and splices
// under it.
func (r *Refs) Splice(src *Refs) {
	if len(src.ids) == 0 {
		return
	}
	r.e = src.e
	r.ids = append(r.ids, src.ids...)
	src.ids = src.ids[:0]
}
