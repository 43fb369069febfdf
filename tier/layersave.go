package tier

import (
	"context"
	"math/bits"
	"sync"
	"sync/atomic"

	"kvtier/arena"
	"kvtier/chunk"
)

// Per-layer saves (docs/layerwise.md). A client filling reserved RAM
// objects layer by layer (the vLLM connector's save_kv_layer) says when
// each layer is final; a LayerSave then writes that layer of every chunk
// to each lower tier that can write ranges (RangeWriter: the disk tier,
// and a Redis tier of raw chunks) while the next layer is still being
// computed, each tier on its own goroutine, so a slow one holds up no
// other. At the commit the chunks become RAM chunks as usual and are
// queued for the other lower tiers; the LayerSave finishes its tiers'
// objects (the pieces no layer completed, the header, the sync or the
// publish) on its own goroutines. A save that ends without a commit — the
// lease released, expired or cut short by the connection — gives back
// every extent it reserved and drops every staged object.
//
// A save never waits for room on its tier: its own open records would be
// what it waits for. A chunk the tier has no room for when its first
// layer arrives gets no range write and is written whole at the commit
// (RangeWriter.OpenWrite). Its memory is a few words per 64 layers and
// tier, whatever the client claims the chunks hold.

// LayerSave writes the chunks of one store lease to lower tiers layer by
// layer. Its methods are safe for concurrent use and never block on I/O.
type LayerSave struct {
	m       *Manager
	geo     LayerGeometry
	keys    []chunk.Key
	targets []*saveTarget
	end     chan struct{}
	// opening ends with an abort, or when the last target is done:
	// OpenWrite's waits (for evictions' punches) give up then.
	opening context.Context
	stop    context.CancelFunc
	running atomic.Int32 // targets whose goroutine has not ended

	mu        sync.Mutex
	seen      []uint64 // bitmap of layers noticed
	ended     bool     // committed or aborted
	aborted   bool
	committed []bool // chunks the commit made visible, which the save owes its tiers
}

// saveTarget is one lower tier a save writes by ranges, with its own
// goroutine, queue of layers and references on the chunks.
type saveTarget struct {
	s      *LayerSave
	lt     *lowerTier
	rw     RangeWriter
	ids    []arena.ID // the target's own reference on each reservation; 0 for none
	wake   chan struct{}
	queued []uint64 // bitmap of layers noticed and not yet taken; guarded by s.mu
	gen    uint32   // the tier's Sync generation the committed chunks count in
}

// BeginLayerSave starts a per-layer save of the reserved objects ids[i]
// (0: no reservation, the chunk is stored already) that will be committed
// under keys[i], consecutive chunks of one prompt from its first, through
// CommitRunSaved. It returns nil when no lower tier writes ranges now, geo
// is not a layer geometry or the manager is closed: the commit then queues
// whole chunks as CommitRun does. The save holds its own references, so
// the objects outlive the lease until their records are written. Every
// save must end, by CommitRunSaved or Abort: Close waits for the saves'
// goroutines (the engine aborts a lease's save when the lease ends).
func (m *Manager) BeginLayerSave(keys []chunk.Key, ids []arena.ID, geo LayerGeometry) *LayerSave {
	if !geo.Valid() {
		return nil
	}
	words := (geo.Layers + 63) / 64
	s := &LayerSave{m: m, geo: geo, keys: append([]chunk.Key(nil), keys...), end: make(chan struct{}),
		seen: make([]uint64, words), committed: make([]bool, len(keys))}
	for _, lt := range m.lower {
		if rw := rangeWriterOf(lt); rw != nil {
			s.targets = append(s.targets, &saveTarget{s: s, lt: lt, rw: rw, ids: make([]arena.ID, len(ids)),
				wake: make(chan struct{}, 1), queued: make([]uint64, words)})
		}
	}
	if len(s.targets) == 0 {
		return nil
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil
	}
	s.opening, s.stop = context.WithCancel(context.Background())
	for _, t := range s.targets {
		for i, id := range ids {
			if id != 0 && m.arena.Ref(id) {
				t.ids[i] = id
			}
		}
	}
	s.running.Store(int32(len(s.targets)))
	m.wg.Add(len(s.targets))
	for _, t := range s.targets {
		go t.run()
	}
	return s
}

// rangeWriterOf returns lt as a RangeWriter when a save is to write to it
// by ranges now.
func rangeWriterOf(lt *lowerTier) RangeWriter {
	w, ok := lt.Tier.(RangeWriter)
	if !ok || lt.readOnly {
		return nil
	}
	if c, ok := lt.Tier.(RangeWriteChooser); ok && !c.WritesRanges() {
		return nil
	}
	return w
}

// target returns the save's target on lt, or nil.
func (s *LayerSave) target(lt *lowerTier) *saveTarget {
	for _, t := range s.targets {
		if t.lt == lt {
			return t
		}
	}
	return nil
}

// Layers returns the save's geometry.
func (s *LayerSave) Layers() LayerGeometry { return s.geo }

// Layer says that layer is final in every chunk: the save starts writing
// it. A layer noticed twice, out of range, or after the save ended is
// ignored.
func (s *LayerSave) Layer(layer int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended || layer < 0 || layer >= s.geo.Layers {
		return
	}
	w, b := layer/64, uint64(1)<<(layer%64)
	if s.seen[w]&b != 0 {
		return
	}
	s.seen[w] |= b
	for _, t := range s.targets {
		t.queued[w] |= b
		select {
		case t.wake <- struct{}{}:
		default: // run is woken already and takes every queued layer
		}
	}
}

// take takes the lowest run of adjacent queued layers off t's queue.
func (t *saveTarget) take() (first, last int, ok bool) {
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for w, q := range t.queued {
		if q == 0 {
			continue
		}
		first = w*64 + bits.TrailingZeros64(q)
		last = first
		for last+1 < s.geo.Layers && t.queued[(last+1)/64]&(1<<((last+1)%64)) != 0 {
			last++
		}
		for l := first; l <= last; l++ {
			t.queued[l/64] &^= 1 << (l % 64)
		}
		return first, last, true
	}
	return 0, 0, false
}

// Abort ends the save without a commit: nothing it wrote becomes visible,
// and its tier gets the extents back. It does not wait for the I/O under
// way.
func (s *LayerSave) Abort() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.ended, s.aborted = true, true
		s.stop()
		close(s.end)
	}
}

// CommitRunSaved is CommitRun for a store whose chunks s is writing: the
// chunks become RAM chunks and are queued for every lower tier but s's,
// and s finishes their objects in its tiers in the background (counted as
// pending writes, so Flush and Sync wait for them). s ends here: chunks
// past len(keys) are given up. A nil s is CommitRun.
func (m *Manager) CommitRunSaved(keys []chunk.Key, ids []arena.ID, s *LayerSave) error {
	if s == nil || !s.claim() {
		return m.CommitRun(keys, ids)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	defer func() {
		for _, id := range ids[:len(keys)] {
			if id != 0 {
				m.arena.Unref(id)
			}
		}
	}()
	defer close(s.end)
	if m.closed {
		return ErrClosed
	}
	budget := writeBudget{wait: m.opts.WriteWait}
	defer budget.stop()
	for _, t := range s.targets {
		t.gen = t.lt.gen.Load() & 1
	}
	for i, k := range keys {
		if ids[i] == 0 || m.ram.Contains(k) {
			continue
		}
		up := parentOf(keys, i, link{})
		m.ram.CommitAfter(k, up.parent, up.ok, ids[i])
		for _, lt := range m.lower {
			if t := s.target(lt); t != nil && i < len(s.committed) && t.ids[i] != 0 {
				s.committed[i] = true
				lt.pending.Add(1)
				lt.inflight[t.gen].Add(1)
				continue
			}
			if !lt.readOnly && !m.enqueue(lt, k, up, ids[i], &budget) {
				break
			}
		}
	}
	return nil
}

// claim ends s for a commit, unless it ended already.
func (s *LayerSave) claim() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return false
	}
	s.ended = true
	return true
}

// run writes the layers as they are noticed, until the save ends, then
// finishes or gives up each chunk. Layers noticed while a write was under
// way are written together: adjacent layers are adjacent bytes in each
// part, so a save that falls behind catches up with fewer, larger writes.
// Layers noticed before a commit are written by ranges even when the
// commit came first, so that every notice taken counts; after an abort
// nothing more is written.
func (t *saveTarget) run() {
	s := t.s
	defer s.m.wg.Done()
	defer func() {
		if s.running.Add(-1) == 0 {
			s.stop()
		}
	}()
	ctx := context.Background() // writes are bounded I/O: they run to their end
	var ws []RangeWrite         // opened with the first layer
	for {
		select {
		case <-t.wake:
			ws = t.drain(ctx, ws)
		case <-s.end:
			ws = t.drain(ctx, ws)
			t.finish(ctx, ws)
			return
		}
	}
}

// drain writes the queued layers, opening the range writes first if they
// are not open yet, until none is queued or the save is aborted.
func (t *saveTarget) drain(ctx context.Context, ws []RangeWrite) []RangeWrite {
	for !t.s.isAborted() {
		first, last, ok := t.take()
		if !ok {
			break
		}
		if ws == nil {
			ws = t.open(t.s.opening)
		}
		t.write(ctx, ws, first, last)
	}
	return ws
}

func (s *LayerSave) isAborted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.aborted
}

// openers bounds the range writes a target opens at once: each is a
// round trip or two (Redis: a STRLEN and the staging key's MULTI), which
// one after another would hold the first layer back for long, while
// unbounded they would ask a shared store for every chunk at once.
const openers = 8

// open starts a range write of every chunk the tier lacks and whose size
// fits the geometry, up to openers at a time (one at a time, in order, on
// a RoomReserver); the others get none (nil).
// Once ctx is done (the save aborted) it opens no more, and returns when
// the opens under way have: the save's finish aborts what they opened.
func (t *saveTarget) open(ctx context.Context) []RangeWrite {
	s := t.s
	ws := make([]RangeWrite, len(s.keys))
	limit := openers
	if _, inOrder := t.rw.(RoomReserver); inOrder {
		limit = 1 // the room goes to the earliest chunks (RoomReserver)
	}
	sem := make(chan struct{}, limit)
	var wg sync.WaitGroup
	for c, id := range t.ids {
		if id == 0 {
			continue
		}
		n := len(s.m.arena.Bytes(id))
		if _, _, fits := s.geo.Range(n, 0, 0); !fits {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			// A chunk that gets no writer, for whatever reason, is
			// written whole at the commit, which reports a failure then.
			ws[c], _ = t.rw.OpenWrite(ctx, s.keys[c], n) // this goroutine's own element
		}()
	}
	wg.Wait()
	return ws
}

// write writes layers first..last of every chunk with a writer, one
// range per part, the chunks in parallel so that the tier has a write
// queued while it sums another. A chunk whose write fails loses its
// writer; the commit writes it whole.
func (t *saveTarget) write(ctx context.Context, ws []RangeWrite, first, last int) {
	s := t.s
	var wg sync.WaitGroup
	for c, w := range ws {
		if w == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := s.m.arena.Bytes(t.ids[c])
			for part := range s.geo.Parts {
				from, _, _ := s.geo.Range(len(src), first, part)
				_, to, _ := s.geo.Range(len(src), last, part)
				if err := w.WriteRange(ctx, src, from, to); err != nil {
					s.m.writeFailed(t.lt, s.keys[c], err)
					w.Abort()
					ws[c] = nil // this goroutine's own element
					return
				}
				t.lt.layerBytes.Add(uint64(to - from))
			}
		}()
	}
	wg.Wait()
}

// finish commits the records of the committed chunks — the rest of a
// range write, or the whole chunk where it had none or it failed — and
// aborts the others, then drops the save's references. The chunks commit
// in parallel, so their syncs are shared as concurrent Puts' are. Chunks
// written whole go last: the range writes are then records or given back,
// so the room a whole write needs can come from them.
func (t *saveTarget) finish(ctx context.Context, ws []RangeWrite) {
	s := t.s
	var wg sync.WaitGroup
	var whole []int
	for c, id := range t.ids {
		if id == 0 {
			continue
		}
		var w RangeWrite
		if ws != nil {
			w = ws[c]
		}
		if !s.committed[c] {
			if w != nil {
				w.Abort()
			}
			s.m.arena.Unref(id)
			continue
		}
		if w == nil {
			whole = append(whole, c)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.finishChunk(ctx, c, w)
		}()
	}
	wg.Wait()
	for _, c := range whole {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.finishChunk(ctx, c, nil)
		}()
	}
	wg.Wait()
}

// finishChunk commits committed chunk c's object in t's tier.
func (t *saveTarget) finishChunk(ctx context.Context, c int, w RangeWrite) {
	s := t.s
	m, lt, id := s.m, t.lt, t.ids[c]
	k, src := s.keys[c], m.arena.Bytes(id)
	up := parentOf(s.keys, c, link{})
	var err error
	if w != nil {
		if err = w.Commit(ctx, src, up.parent, up.ok); err == nil && !foundStored(w) {
			lt.layerSaved.Add(1)
		}
	}
	if (w == nil || err != nil) && !Contains(lt.Tier, k) {
		err = put(lt.Tier, writeJob{key: k, id: id, up: up}, src)
	}
	t.settle(k, err)
	m.arena.Unref(id)
	lt.inflight[t.gen].Add(-1)
	lt.pending.Add(-1)
}

// foundStored reports whether w's commit found its object stored
// already (a content-addressed store another writer filled first), so
// that nothing of w's ranges was committed: layer_saved does not count it.
func foundStored(w RangeWrite) bool {
	r, ok := w.(interface{ FoundStored() bool })
	return ok && r.FoundStored()
}

// settle does a queued write's bookkeeping for chunk k, as the writers
// do: a failure is redone by Sync, and a chunk removed from RAM while it
// was written is removed from the tier again.
func (t *saveTarget) settle(k chunk.Key, err error) {
	m, lt := t.s.m, t.lt
	if err != nil {
		lt.missed.add(k)
		m.writeFailed(lt, k, err) // not for ErrRangeOpen: missed, not refused
	} else {
		m.writeSucceeded(lt)
		if !m.ram.Contains(k) {
			Remove(lt.Tier, k)
		}
	}
	m.trimQuota(k)
}
