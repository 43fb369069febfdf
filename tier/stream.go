package tier

import (
	"context"
	"errors"
	"sync"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
)

// Layerwise retrieval: AcquireStream reserves RAM for every lower-tier
// chunk of a hit at once and returns, then fills those objects layer by
// layer in the background; Stream.Wait tells a reader when a layer of
// every chunk is in place. See docs/layerwise.md.

// LayerGeometry says where each layer of a chunk lies in its bytes, for
// the layouts in which a chunk is Parts × Layers equal spans, part-major:
// KV_2LTD ([2, layers, tokens, row]: Parts 2, every layer's K, then every
// layer's V) and KV_MLA_FMT (Parts 1). The spans' length follows from the
// chunk's size, so a partial chunk (fewer tokens) needs nothing more.
type LayerGeometry struct {
	Layers int // layers in a chunk
	Parts  int // spans per layer: 2 (K and V) or 1 (MLA's latent)
}

// MaxLayers bounds LayerGeometry.Layers.
const MaxLayers = 1 << 16

// Valid reports whether g describes a layered chunk.
func (g LayerGeometry) Valid() bool {
	return g.Layers > 0 && g.Layers <= MaxLayers && (g.Parts == 1 || g.Parts == 2)
}

// Range returns part's byte range [from, to) of layer in an n-byte chunk,
// and false when n does not split into Parts × Layers equal spans.
func (g LayerGeometry) Range(n, layer, part int) (from, to int, ok bool) {
	if !g.Valid() || n <= 0 || n%(g.Layers*g.Parts) != 0 || layer < 0 || layer >= g.Layers || part < 0 || part >= g.Parts {
		return 0, 0, false
	}
	span := n / (g.Layers * g.Parts)
	from = (part*g.Layers + layer) * span
	return from, from + span, true
}

// streamAhead is how many layers a chunk's reads may run ahead of the
// layers ready in every chunk, once layer 0 is: enough to keep the tier's
// queue full while the slowest chunk catches up, few enough that layer i
// of all chunks is read before layer i+3 of any. Before layer 0 is ready
// everywhere no chunk reads further, so nothing competes with it.
const streamAhead = 2

// Stream is the background fill of one layerwise acquire.
type Stream struct {
	m      *Manager
	geo    LayerGeometry
	first  link
	keys   []chunk.Key
	ids    []arena.ID // the stream's own reference on each reserved object; 0 for RAM chunks
	tiers  []int      // lower tier of each chunk, -1 for RAM chunks
	cancel context.CancelFunc
	timer  *time.Timer   // cancels at the deadline; Extend moves it
	whole  chan struct{} // bounds whole-chunk reads in flight to FetchParallel

	mu      sync.Mutex
	done    []int // layers in place for each chunk
	usable  int   // chunks before the first failure
	ready   int   // layers in place in every usable chunk
	over    bool  // every read has ended and the chunks are committed
	changed chan struct{}
}

// AcquireStream is Acquire for a reader that takes chunks layer by layer.
// It refs RAM chunks as Acquire does and reserves a RAM object for each
// lower-tier chunk of the hit, in key order, without reading it; it returns
// how many chunks the hit holds and, when some must be read, the Stream
// filling them (nil when all were in RAM). The objects become visible RAM
// chunks once all their layers are in; chunks from the first failed read on
// never do. ctx bounds the reservations and the whole-chunk fallback;
// deadline bounds the background reads (the lease's deadline), which
// Stream.Cancel ends sooner.
func (m *Manager) AcquireStream(ctx context.Context, keys []chunk.Key, ids []arena.ID, geometry func() LayerGeometry, deadline time.Time) (int, *Stream, error) {
	return m.acquireStream(ctx, keys, ids, geometry, false, deadline)
}

// AcquireStreamExact is AcquireStream for a geometry a reader stated:
// every chunk of the hit must split into geo's spans. When the hit reaches
// below RAM, every chunk's size — in RAM, or as the lower tier that holds
// it records it — is checked before anything is reserved or read, and on a
// misfit nothing is held and the error wraps ErrGeometry
// (streamcheck.go). A hit wholly in RAM is returned referenced, without
// the check: the caller reads those chunks' sizes for their slots anyway,
// and must hold them against geo (Fits) and drop the references on a
// misfit.
func (m *Manager) AcquireStreamExact(ctx context.Context, keys []chunk.Key, ids []arena.ID, geo LayerGeometry, deadline time.Time) (int, *Stream, error) {
	if !geo.Valid() {
		return 0, nil, GeometryError(geo, -1, 0)
	}
	return m.acquireStream(ctx, keys, ids, func() LayerGeometry { return geo }, true, deadline)
}

// acquireStream is AcquireStream; with exact, when the hit reaches below
// RAM, every chunk's size is held against the geometry (checkHit) before
// anything is reserved or read.
func (m *Manager) acquireStream(ctx context.Context, keys []chunk.Key, ids []arena.ID, geometry func() LayerGeometry, exact bool, deadline time.Time) (int, *Stream, error) {
	n := m.ram.Acquire(keys, ids)
	if n == len(keys) || len(m.lower) == 0 {
		return n, nil, nil
	}
	geo := geometry() // only now: a RAM hit need not know it
	if !geo.Valid() {
		var first link
		if n > 0 {
			first = link{keys[n-1], true}
		}
		got, err := m.promote(ctx, first, keys[n:], ids[n:], len(m.lower)) // not layered: whole chunks
		return n + got, nil, err
	}
	var below []hitChunk
	if exact {
		var err error
		if below, err = m.checkHit(keys, ids[:n], geo); err != nil {
			for _, id := range ids[:n] {
				m.arena.Unref(id)
			}
			return 0, nil, err
		}
	}
	s := &Stream{m: m, geo: geo, changed: make(chan struct{}), whole: make(chan struct{}, m.opts.FetchParallel)}
	if n > 0 {
		s.first = link{keys[n-1], true}
	}
	var err error
	i := n
	for ; i < len(keys); i++ {
		if i > n && m.ram.Acquire(keys[i:i+1], ids[i:i+1]) == 1 {
			s.add(keys[i], 0, -1)
			if exact && !geo.Fits(m.arena.Size(ids[i])) { // in RAM since checkHit looked
				err = GeometryError(geo, i, m.arena.Size(ids[i]))
				i++
				break
			}
			continue
		}
		var t, size int
		if c := i - n; c < len(below) && below[c].tier >= 0 { // as checkHit found it
			t, size = below[c].tier, below[c].size
		} else {
			if t = m.holder(keys[i], len(m.lower)); t < 0 {
				break
			}
			var ok bool
			if size, ok = m.lower[t].Size(keys[i]); !ok {
				break
			}
			if exact && !geo.Fits(size) { // before its reservation: nothing to undo for it
				err = GeometryError(geo, i, size)
				break
			}
		}
		id, _, rerr := m.ram.Reserve(size)
		if rerr != nil {
			if !errors.Is(rerr, arena.ErrNoSpace) && !errors.Is(rerr, ErrTooLarge) {
				err = rerr
			}
			break
		}
		ids[i] = id
		m.arena.Ref(id) // the stream's own, so the fill outlives an early release
		s.add(keys[i], id, t)
	}
	if errors.Is(err, ErrGeometry) { // a chunk changed since checkHit: give everything back
		s.undo(ids[:i])
		return 0, nil, err
	}
	if i == n { // nothing below RAM after all
		return n, nil, err
	}
	s.done = make([]int, len(s.keys))
	for c, t := range s.tiers {
		if t < 0 {
			s.done[c] = geo.Layers
		}
	}
	s.usable = len(s.keys)
	m.mu.RLock()
	if m.closed {
		m.mu.RUnlock()
		s.cancel = func() {}
		s.fail(0)
		s.finish()
		return n + len(s.keys), s, err
	}
	m.wg.Add(1)
	m.mu.RUnlock()
	// A cancel at the deadline rather than a context deadline, so that a
	// renewed lease can move it (Extend).
	var bg context.Context
	bg, s.cancel = context.WithCancel(context.Background())
	s.timer = time.AfterFunc(time.Until(deadline), s.cancel)
	go s.run(bg)
	return n + len(s.keys), s, err
}

// add appends a chunk to the stream: id 0 and tier -1 for one in RAM.
func (s *Stream) add(k chunk.Key, id arena.ID, t int) {
	s.keys, s.ids, s.tiers = append(s.keys, k), append(s.ids, id), append(s.tiers, t)
}

// Layers returns how many layers each chunk has.
func (s *Stream) Layers() int { return s.geo.Layers }

// Chunks returns how many chunks the stream covers: the acquire's hit
// after the leading RAM chunks.
func (s *Stream) Chunks() int { return len(s.keys) }

// Wait blocks until layer is in place in every usable chunk (or every
// read has ended) or ctx ends, and returns how many of the stream's
// chunks are usable — in order from its first; the rest failed and must be
// recomputed — and how many layers are ready in all of them.
func (s *Stream) Wait(ctx context.Context, layer int) (usable, ready int, err error) {
	for {
		s.mu.Lock()
		usable, ready, ch := s.usable, s.ready, s.changed
		over := s.over
		s.mu.Unlock()
		if ready > layer || over {
			return usable, ready, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return usable, ready, ctx.Err()
		}
	}
}

// Cancel ends the reads still under way: the chunks they were filling
// fail (and are never committed). The engine calls it when it closes; a
// lease released or expired earlier leaves the reads to finish (they hold
// their own references) so the promotion completes, until the deadline.
func (s *Stream) Cancel() { s.cancel() }

// Extend moves the reads' deadline to deadline (a renewed lease's), unless
// it has passed already: then the reads have been cancelled and stay so.
func (s *Stream) Extend(deadline time.Time) {
	if s.timer != nil && s.timer.Stop() {
		s.timer.Reset(time.Until(deadline))
	}
}

// Done reports whether every read has ended.
func (s *Stream) Done() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.over
}

// run reads every lower-tier chunk, one goroutine each, then commits the
// usable ones and drops the stream's references.
func (s *Stream) run(ctx context.Context) {
	defer s.m.wg.Done()
	var wg sync.WaitGroup
	for c, t := range s.tiers {
		if t >= 0 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.fill(ctx, c)
			}()
		}
	}
	wg.Wait()
	s.finish()
	s.timer.Stop()
	s.cancel()
}

// fill reads chunk c layer by layer, or whole when its tier cannot read
// ranges or its size does not fit the geometry.
func (s *Stream) fill(ctx context.Context, c int) {
	lt := s.m.lower[s.tiers[c]]
	buf := s.m.arena.Bytes(s.ids[c])
	rr, ranged := readsRanges(lt.Tier)
	if _, _, fits := s.geo.Range(len(buf), 0, 0); !ranged || !fits {
		if !s.await(ctx, c, 0) {
			return
		}
		s.whole <- struct{}{} // as many whole reads at once as a promotion makes
		n, err := lt.Get(ctx, s.keys[c], buf)
		<-s.whole
		if err == nil && n != len(buf) {
			err = ErrCorrupt
		}
		s.progress(ctx, c, s.geo.Layers, err)
		return
	}
	r, err := rr.OpenRange(ctx, s.keys[c], buf)
	if err != nil {
		s.progress(ctx, c, 0, err)
		return
	}
	defer r.Close()
	if pr, ok := r.(PipelinedRead); ok && s.geo.Parts <= MaxSpans {
		s.fillPipelined(ctx, c, pr, len(buf))
		return
	}
	for layer := 0; layer < s.geo.Layers; {
		if !s.await(ctx, c, layer) {
			return
		}
		// Every layer the window allows in one range per part: the
		// layers of a part are adjacent, and a store that pays a round
		// trip per range (S3) reads three layers for the price of one.
		last := s.widen(layer, s.reach(layer), len(buf))
		for part := range s.geo.Parts {
			// Range's ok is known: the size fits the geometry (checked
			// above), so every layer and part has its range.
			from, _, _ := s.geo.Range(len(buf), layer, part)
			_, to, _ := s.geo.Range(len(buf), last, part)
			if err = r.ReadRange(ctx, from, to); err != nil {
				break
			}
		}
		if !s.progress(ctx, c, last+1, err) {
			return
		}
		layer = last + 1
	}
}

// reach returns the last layer from layer on that the window lets a chunk
// read now: layer itself until layer 0 is ready everywhere, then up to
// streamAhead layers past the layers ready everywhere.
func (s *Stream) reach(layer int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ready == 0 {
		return layer
	}
	return min(max(layer, s.ready+streamAhead), s.geo.Layers-1)
}

// minRangeBytes is the least a read of a chunk's part covers when the
// part has that many bytes. A geometry may state up to 65,535 layers, and
// a read per layer (or per window of three) of spans a few bytes long
// would cost a tier request (a range read, a RETRIEVE_RANGES to a peer)
// and a progress update, with a wake of every waiter, per few bytes:
// thousands per chunk. Reads of at least a disk block cost the tiers no
// more I/O than reads of one layer, and bound that work by the chunk's
// size rather than its layer count; LAYER_WAIT counts layers as stated
// all the same, a read's layers becoming ready together.
const minRangeBytes = 4 << 10

// widen returns the last layer of a read from layer that ends at last or
// later, so that it covers at least minRangeBytes of each part of an
// n-byte chunk (or the rest of the part).
func (s *Stream) widen(layer, last, n int) int {
	span := n / (s.geo.Layers * s.geo.Parts)
	if span <= 0 || span >= minRangeBytes {
		return last
	}
	return min(max(last, layer+(minRangeBytes+span-1)/span-1), s.geo.Layers-1)
}

// pipelineAhead is how much further than streamAhead a chunk read by a
// PipelinedRead may ask while a request of it is in flight: one more
// request's worth of layers, so that the slowest chunk, whose window
// ends streamAhead past the layers ready everywhere, can ask for its
// next layers before its current ones have arrived.
const pipelineAhead = streamAhead + 1

// fillPipelined reads chunk c through r with up to PipelineDepth requests
// in flight, each every part of up to streamAhead + 1 adjacent layers in
// one round trip. The window is the one fill keeps, widened by
// pipelineAhead for a request sent while another is in flight; layer 0
// of every chunk still comes first.
func (s *Stream) fillPipelined(ctx context.Context, c int, r PipelinedRead, size int) {
	var inflight [PipelineDepth]int // last layer of each request in flight, oldest first
	var spans [MaxSpans]Span
	k := 0
	for layer := 0; layer < s.geo.Layers || k > 0; {
		if err := s.stopped(ctx); err != nil {
			s.progress(ctx, c, 0, err)
			return
		}
		if layer < s.geo.Layers && k < PipelineDepth {
			ok, near := s.window(c, layer, k > 0)
			if !ok {
				return
			}
			if !near && k == 0 {
				if !s.await(ctx, c, layer) {
					return
				}
				near = true
			}
			if near {
				last := s.widen(layer, s.sendReach(layer), size)
				for part := range s.geo.Parts {
					// Range's ok is known: fill checked that size fits
					// the geometry before reading by ranges.
					from, _, _ := s.geo.Range(size, layer, part)
					_, to, _ := s.geo.Range(size, last, part)
					spans[part] = Span{from, to}
				}
				if err := r.Send(ctx, spans[:s.geo.Parts]); err != nil {
					s.progress(ctx, c, 0, err)
					return
				}
				inflight[k], k, layer = last, k+1, last+1
				continue
			}
		}
		if err := r.Recv(ctx); err != nil {
			s.progress(ctx, c, 0, err)
			return
		}
		done := inflight[0]
		copy(inflight[:], inflight[1:k])
		k--
		if !s.progress(ctx, c, done+1, nil) {
			return
		}
	}
}

// stopped returns why the reads must end now, if they must: the manager
// is closing (Close waits for the stream) or ctx ended.
func (s *Stream) stopped(ctx context.Context) error {
	if s.m.stopping.Load() {
		return ErrClosed
	}
	return ctx.Err()
}

// window reports whether chunk c is still usable and whether layer is
// within its window now: streamAhead past the layers ready everywhere,
// plus pipelineAhead when a request is in flight (busy), and layer 0
// alone until layer 0 is ready everywhere. It never waits.
func (s *Stream) window(c, layer int, busy bool) (usable, near bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ahead := streamAhead
	if busy {
		ahead += pipelineAhead
	}
	if s.ready == 0 {
		ahead = 0
	}
	return c < s.usable, s.ready+ahead >= layer
}

// sendReach returns the last layer of a request starting at layer: as
// far as the window lets (window's busy reach), at most streamAhead + 1
// layers, and layer alone before layer 0 is ready everywhere.
func (s *Stream) sendReach(layer int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ready == 0 {
		return layer
	}
	return min(max(layer, s.ready+streamAhead+pipelineAhead), layer+streamAhead, s.geo.Layers-1)
}

// await blocks chunk c's reader until layer is within streamAhead of the
// layers ready everywhere, and reports false when c is no longer usable
// (an earlier chunk failed) or ctx ended.
func (s *Stream) await(ctx context.Context, c, layer int) bool {
	for {
		s.mu.Lock()
		ahead := streamAhead
		if s.ready == 0 {
			ahead = 0 // layer 0 of every chunk first: it is what the reader waits for now
		}
		ok, near, ch := c < s.usable, s.ready+ahead >= layer, s.changed
		s.mu.Unlock()
		if !ok {
			return false
		}
		if s.m.stopping.Load() { // Close waits for the stream: stop reading
			s.progress(ctx, c, 0, ErrClosed)
			return false
		}
		if near {
			return true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			s.progress(ctx, c, 0, ctx.Err())
			return false
		}
	}
}

// progress records that chunk c has its first layers in place, or that it
// failed (err): then it and every chunk after it become unusable. It
// reports whether c is still usable.
func (s *Stream) progress(ctx context.Context, c, layers int, err error) bool {
	if err != nil {
		s.m.readFailure(ctx, err) // counts and logs tier failures
		s.fail(c)
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done[c] = layers
	s.update(false)
	return c < s.usable
}

// fail makes chunks c and after unusable.
func (s *Stream) fail(c int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c < s.usable {
		s.usable = c
		s.update(true)
	}
}

// update recomputes ready and wakes the waiters when it changed (or when
// changed says something else they look at did: usable, over). A chunk
// that gets ahead of the slowest one changes nothing anyone waits for, and
// waking every reader and LAYER_WAIT for it cost the daemon a futile
// goroutine wakeup (often a thread wakeup) per reader per range. Called
// with s.mu held.
func (s *Stream) update(changed bool) {
	ready := s.geo.Layers
	for _, d := range s.done[:s.usable] {
		ready = min(ready, d)
	}
	if ready == s.ready && !changed {
		return
	}
	s.ready = ready
	close(s.changed)
	s.changed = make(chan struct{})
}

// finish commits the usable chunks in order, queues promoted copies for
// the tiers above the one each came from, and drops the stream's
// references; the lease keeps its own until it ends.
func (s *Stream) finish() {
	s.mu.Lock()
	usable := s.usable
	s.mu.Unlock()
	m := s.m
	for c, id := range s.ids {
		if id == 0 {
			continue
		}
		if c < usable {
			up := parentOf(s.keys, c, s.first)
			m.ram.CommitAfter(s.keys[c], up.parent, up.ok, id)
			m.promoted.Add(1)
			if t := s.tiers[c]; t > 0 {
				m.mu.RLock()
				if !m.closed {
					m.enqueueWrites(s.keys[c], up, id, t, &writeBudget{wait: -1})
				}
				m.mu.RUnlock()
			}
		}
		m.arena.Unref(id)
	}
	s.mu.Lock()
	s.over = true
	s.update(true)
	s.mu.Unlock()
}
