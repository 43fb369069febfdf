package tier

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/internal/ratelog"
)

// MaxTiers bounds the hierarchy's depth (RAM plus lower tiers) so per-tier
// breakdowns fit in fixed arrays on the hot path.
const MaxTiers = 8

// RAM is what the manager needs from the top tier beyond Tier: the
// optional interfaces every RAM tier has, and objects in a shared arena
// that it can hand out, fill and index without extra copies. tier/mem
// implements it.
type RAM interface {
	Tier
	Container
	PrefixContainer
	Remover
	StatsReporter
	io.Closer
	Arena() *arena.Arena
	// Acquire refs the objects of the leading stored keys into ids and
	// returns how many; the caller Unrefs each on the arena.
	Acquire(keys []chunk.Key, ids []arena.ID) int
	// Reserve allocates an invisible object (evicting if needed) holding
	// one caller reference.
	Reserve(size int) (arena.ID, []byte, error)
	// Commit makes a reserved object visible under key.
	Commit(key chunk.Key, id arena.ID)
	// CommitAfter is Commit naming the chunk's parent in its prefix chain
	// (the chunk before it in the prompt) when hasParent is true, for
	// prefix-aware eviction policies.
	CommitAfter(key, parent chunk.Key, hasParent bool, id arena.ID)
	// Clear removes every object of scope (all when scope is 0).
	Clear(scope uint64) int
}

// Options tune the manager. Zero values take the defaults noted.
type Options struct {
	// QueueDepth is the number of pending writes each lower tier may have
	// (default 64). Queued writes hold arena references, not copies.
	QueueDepth int
	// WriteWait is the longest one Store call blocks, in all, on full
	// lower-tier queues; once it is spent, writes that find a queue full
	// are dropped for that tier (default 5ms; negative means never wait).
	// Dropped writes are counted, and written again by Sync and Flush.
	WriteWait time.Duration
	// Writers is the number of writer goroutines per lower tier (default 2).
	Writers int
	// FetchParallel bounds concurrent reads from lower tiers during one
	// retrieve or prefetch (default 4).
	FetchParallel int
	// PrefetchQueue bounds pending prefetch requests (default 256); when it
	// is full a prefetch is dropped: prefetching is a hint.
	PrefetchQueue int
	Logger        *slog.Logger
}

func (o *Options) setDefaults() {
	if o.QueueDepth <= 0 {
		o.QueueDepth = 64
	}
	if o.WriteWait == 0 {
		o.WriteWait = 5 * time.Millisecond
	}
	if o.Writers <= 0 {
		o.Writers = 2
	}
	if o.FetchParallel <= 0 {
		o.FetchParallel = 4
	}
	if o.PrefetchQueue <= 0 {
		o.PrefetchQueue = 256
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Manager orders the tiers: a RAM tier on top and any number of lower tiers
// below it, fastest first. It writes every stored chunk to all tiers (RAM
// synchronously, the rest through bounded queues), reads waterfall from the
// fastest tier holding a key, promotes lower-tier hits into RAM, and
// prefetches whole prefixes in the background.
type Manager struct {
	ram   RAM
	arena *arena.Arena
	lower []*lowerTier
	// local is how many leading lower tiers are NodeLocal: the tiers,
	// with RAM, that the daemon serves its peers from.
	local int
	opts  Options

	syncMu   sync.Mutex   // one Sync at a time: it flips write generations
	mu       sync.RWMutex // guards closed against queue sends
	closed   bool
	stopping atomic.Bool // set by Close so prefetchers stop reading
	prefetch chan []chunk.Key
	wg       sync.WaitGroup

	idPool sync.Pool // *[retrieveWindow]arena.ID scratch for Retrieve

	prefetchDropped atomic.Uint64
	promoted        atomic.Uint64
	readFailed      atomic.Uint64 // lower-tier reads that failed and were served as misses
}

// lowerTier is a tier below RAM with its write queue and counters.
type lowerTier struct {
	Tier
	readOnly bool // a ReadOnly tier: never queued for writes
	queue    chan writeJob
	pending  atomic.Int64  // writes queued or being written
	dropped  atomic.Uint64 // writes dropped because the queue stayed full
	failed   atomic.Uint64 // writes the tier refused
	failing  atomic.Bool   // the last write failed: later failures are not logged
	// Per-layer saves (layersave.go): records committed from their range
	// writes, and the bytes of layers given to range writes.
	layerSaved atomic.Uint64
	layerBytes atomic.Uint64
	// failLog writes refused writes to the log at most once per
	// failLogEvery: a tier that refuses everything (a full disk, a store
	// that is down) would otherwise log once per write.
	failLog *ratelog.Limiter
	redoLog ratelog.Set // FLUSH's writes again, refused once more: one per chunk

	// Sync's bookkeeping: writes are counted in one of two generations,
	// so Sync can wait for those queued before it without waiting for
	// those queued after (see Sync). missed holds the writes dropped or
	// refused since, for Sync to redo.
	gen      atomic.Uint32
	inflight [2]atomic.Int64
	missed   missedSet
	// gone holds acknowledged chunks lt lacks for good (their write was
	// lost and they left RAM before a Sync could redo it): unlike missed,
	// every Sync reports them, until stored again, removed or cleared.
	gone missedSet
}

// failLogEvery is the least time between two log lines about one tier's
// refused writes; QueueStats.Failed counts every one.
const failLogEvery = 10 * time.Second

// writeJob asks a writer to copy one RAM object to a lower tier. It holds
// an arena reference that the writer drops when done.
type writeJob struct {
	key chunk.Key
	id  arena.ID
	gen uint32 // the lower tier's generation it is counted in
	up  link   // key's parent, for a ChainPutter
}

// link names a chunk's parent in its prefix chain, when it is known.
type link struct {
	parent chunk.Key
	ok     bool
}

// parentOf returns the link of keys[i] when keys is a run of consecutive
// chunks of one prompt and first names the parent of keys[0].
func parentOf(keys []chunk.Key, i int, first link) link {
	if i > 0 {
		return link{keys[i-1], true}
	}
	return first
}

// NewManager builds a manager over ram and the lower tiers, fastest first,
// and starts their writers. The manager owns the tiers: Close closes them.
func NewManager(ram RAM, lower []Tier, opts Options) (*Manager, error) {
	if ram == nil {
		return nil, errors.New("tier manager: a RAM tier is required")
	}
	if len(lower)+1 > MaxTiers {
		return nil, fmt.Errorf("tier manager: %d tiers, at most %d", len(lower)+1, MaxTiers)
	}
	opts.setDefaults()
	m := &Manager{ram: ram, arena: ram.Arena(), opts: opts, prefetch: make(chan []chunk.Key, opts.PrefetchQueue)}
	m.idPool.New = func() any { return new([retrieveWindow]arena.ID) }
	for _, t := range lower {
		lt := &lowerTier{Tier: t, queue: make(chan writeJob, opts.QueueDepth),
			failLog: ratelog.New(opts.Logger, slog.LevelWarn, "lower tier write failed", failLogEvery)}
		_, lt.readOnly = t.(ReadOnly)
		if _, ok := t.(NodeLocal); ok && m.local == len(m.lower) {
			m.local++
		}
		m.lower = append(m.lower, lt)
		if lt.readOnly {
			continue // nothing is ever queued for it
		}
		for range opts.Writers {
			m.wg.Add(1)
			go m.writer(lt)
		}
	}
	for range 2 {
		m.wg.Add(1)
		go m.prefetcher()
	}
	return m, nil
}

// Tiers returns the tiers, RAM first.
func (m *Manager) Tiers() []Tier {
	ts := []Tier{m.ram}
	for _, lt := range m.lower {
		ts = append(ts, lt.Tier)
	}
	return ts
}

// RAM returns the top tier.
func (m *Manager) RAM() RAM { return m.ram }

// Lookup returns how many leading keys are stored somewhere in the
// hierarchy, how many of those each tier (RAM = 0) would serve, and the
// tier serving the last of them (-1 when none). A key is charged to the
// fastest tier holding it, as Acquire would read it.
func (m *Manager) Lookup(keys []chunk.Key) (n int, byTier [MaxTiers]int, last int) {
	return m.lookup(keys, len(m.lower))
}

// LookupLocal is Lookup over RAM and the NodeLocal tiers only: what this
// node can serve a peer.
func (m *Manager) LookupLocal(keys []chunk.Key) (n int, byTier [MaxTiers]int, last int) {
	return m.lookup(keys, m.local)
}

// lookup is Lookup over RAM and the first upTo lower tiers.
func (m *Manager) lookup(keys []chunk.Key, upTo int) (n int, byTier [MaxTiers]int, last int) {
	last = -1
	// A run served by RAM ends at a chunk RAM lacks, so the next run
	// starts below RAM: asking RAM again would only take its lock to
	// miss the same key (a partial hit with no lower tier did that).
	skipRAM := false
	for n < len(keys) {
		c, t := 0, 0
		if !skipRAM {
			c = m.ram.PrefixContains(keys[n:])
		}
		for i := 0; c == 0 && i < upTo; i++ {
			c, t = PrefixContains(m.lower[i].Tier, keys[n:]), i+1
			for j := 1; j < c; j++ { // end the run where RAM takes over
				if m.ram.Contains(keys[n+j]) {
					c = j
				}
			}
		}
		if c == 0 {
			break
		}
		byTier[t] += c
		n += c
		last = t
		skipRAM = t == 0
	}
	return n, byTier, last
}

// Store writes chunks[i] under keys[i] into RAM and queues it for every
// lower tier. It returns how many chunks it stored; chunks already in RAM
// count as stored, and are queued again for any lower tier that lacks
// them. Full lower-tier queues block it at most Options.WriteWait in all.
func (m *Manager) Store(ctx context.Context, keys []chunk.Key, chunks [][]byte) (int, error) {
	return m.store(ctx, false, link{}, keys, chunks)
}

// StoreAfter is Store for keys that are consecutive chunks of one prompt,
// following parent (the chunk just before keys[0]): every tier whose
// eviction is prefix-aware learns each chunk's parent.
func (m *Manager) StoreAfter(ctx context.Context, parent chunk.Key, keys []chunk.Key, chunks [][]byte) (int, error) {
	return m.store(ctx, true, link{parent, true}, keys, chunks)
}

// StoreChain is Store for keys that are consecutive chunks of one prompt
// starting at its first chunk.
func (m *Manager) StoreChain(ctx context.Context, keys []chunk.Key, chunks [][]byte) (int, error) {
	return m.store(ctx, true, link{}, keys, chunks)
}

// store is Store; when chained, keys[i-1] is the parent of keys[i] and
// first the link of keys[0].
func (m *Manager) store(ctx context.Context, chained bool, first link, keys []chunk.Key, chunks [][]byte) (int, error) {
	if len(chunks) < len(keys) {
		return 0, fmt.Errorf("tier manager: %d keys but %d chunks", len(keys), len(chunks))
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return 0, ErrClosed
	}
	budget := writeBudget{wait: m.opts.WriteWait}
	defer budget.stop()
	var idScratch [1]arena.ID
	for i, k := range keys {
		if err := ctx.Err(); err != nil {
			return i, err
		}
		var up link
		if chained {
			up = parentOf(keys, i, first)
		}
		if m.ram.Contains(k) {
			// Already in RAM. A lower tier may still lack it (a write
			// dropped under backpressure, or the tier joined later).
			if m.lowerMissing(k) && m.ram.Acquire(keys[i:i+1], idScratch[:]) == 1 {
				m.enqueueWrites(k, up, idScratch[0], len(m.lower), &budget)
				m.arena.Unref(idScratch[0])
			}
			continue
		}
		id, buf, err := m.reserveFor(k, len(chunks[i]))
		if err != nil {
			return i, err
		}
		copy(buf, chunks[i])
		m.ram.CommitAfter(k, up.parent, up.ok, id)
		m.enqueueWrites(k, up, id, len(m.lower), &budget)
		m.arena.Unref(id)
	}
	return len(keys), nil
}

// Reserve allocates an invisible RAM object of size bytes for a caller
// that fills it in place (a connector writing into the shared arena). The
// object holds one caller reference: hand it to Commit, or Unref it on
// Arena() to abandon it. An abandoned reservation is never visible.
func (m *Manager) Reserve(size int) (arena.ID, []byte, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return 0, nil, ErrClosed
	}
	return m.ram.Reserve(size)
}

// Commit makes the reserved objects ids[i] visible under keys[i] and queues
// them for every lower tier, like Store does for copied bytes. A key that
// is already in RAM keeps its object. Commit consumes the callers'
// references on ids whatever happens.
func (m *Manager) Commit(keys []chunk.Key, ids []arena.ID) error {
	return m.commit(keys, ids, false, link{})
}

// CommitRun is Commit for consecutive chunks of one prompt, in order:
// keys[i-1] is the parent of keys[i], which prefix-aware eviction policies
// learn. An id of 0 marks a chunk that was stored already and has no
// reservation: it is skipped, and stays the parent of the next.
func (m *Manager) CommitRun(keys []chunk.Key, ids []arena.ID) error {
	return m.commit(keys, ids, true, link{})
}

// CommitRunAfter is CommitRun for a run that follows parent, the chunk
// just before keys[0] in its prompt (a prefill/decode push continuing a
// prompt), so that keys[0] is parent's child rather than a root.
func (m *Manager) CommitRunAfter(parent chunk.Key, keys []chunk.Key, ids []arena.ID) error {
	return m.commit(keys, ids, true, link{parent, true})
}

func (m *Manager) commit(keys []chunk.Key, ids []arena.ID, run bool, first link) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	defer func() {
		for _, id := range ids[:len(keys)] {
			if !run || id != 0 {
				m.arena.Unref(id)
			}
		}
	}()
	if m.closed {
		return ErrClosed
	}
	budget := writeBudget{wait: m.opts.WriteWait}
	defer budget.stop()
	for i, k := range keys {
		if run && ids[i] == 0 || m.ram.Contains(k) {
			continue
		}
		var up link
		if run {
			up = parentOf(keys, i, first)
		}
		m.ram.CommitAfter(k, up.parent, up.ok, ids[i])
		m.enqueueWrites(k, up, ids[i], len(m.lower), &budget)
	}
	return nil
}

// writeBudget bounds how long one Store (or one promotion) may block on
// full lower-tier queues in all: Options.WriteWait from the first time a
// queue is found full. The timer is made only then, so a Store that never
// meets a full queue allocates nothing.
type writeBudget struct {
	wait     time.Duration
	deadline time.Time
	timer    *time.Timer
}

// expired returns a channel that fires when the budget is spent, or nil
// when it already is.
func (b *writeBudget) expired() <-chan time.Time {
	if b.wait <= 0 {
		return nil
	}
	if b.deadline.IsZero() {
		b.deadline = time.Now().Add(b.wait)
	}
	left := time.Until(b.deadline)
	if left <= 0 {
		return nil
	}
	if b.timer == nil {
		b.timer = time.NewTimer(left)
	} else {
		b.timer.Reset(left) // since Go 1.23 no stale tick survives a Reset
	}
	return b.timer.C
}

func (b *writeBudget) stop() {
	if b.timer != nil {
		b.timer.Stop()
	}
}

// enqueueWrites queues object id for the first upTo lower tiers, blocking
// on full queues only within budget. Called with m.mu read-locked.
func (m *Manager) enqueueWrites(k chunk.Key, up link, id arena.ID, upTo int, budget *writeBudget) {
	for _, lt := range m.lower[:upTo] {
		if !lt.readOnly && !m.enqueue(lt, k, up, id, budget) {
			return
		}
	}
}

// enqueue queues object id for lt, or counts it dropped when the queue
// stays full past the budget. It reports false when id could not be
// referenced (it is being freed). Called with m.mu read-locked.
func (m *Manager) enqueue(lt *lowerTier, k chunk.Key, up link, id arena.ID, budget *writeBudget) bool {
	if !m.arena.Ref(id) {
		return false
	}
	job := writeJob{key: k, id: id, gen: lt.gen.Load() & 1, up: up}
	lt.pending.Add(1)
	lt.inflight[job.gen].Add(1)
	select {
	case lt.queue <- job:
		return true
	default:
	}
	if expired := budget.expired(); expired != nil {
		select {
		case lt.queue <- job:
			return true
		case <-expired:
		}
	}
	lt.inflight[job.gen].Add(-1)
	lt.pending.Add(-1)
	lt.dropped.Add(1)
	lt.missed.add(k)
	m.arena.Unref(id)
	return true
}

// writer drains one lower tier's queue until Close.
func (m *Manager) writer(lt *lowerTier) {
	defer m.wg.Done()
	for job := range lt.queue {
		if !Contains(lt.Tier, job.key) {
			if err := put(lt.Tier, job, m.arena.Bytes(job.id)); err != nil {
				lt.missed.add(job.key)
				m.writeFailed(lt, job.key, err)
			} else {
				m.writeSucceeded(lt)
				if !m.ram.Contains(job.key) {
					// Removed (or cleared) while queued: eviction cannot be
					// why, since this job's reference keeps the object busy.
					// Undo the write so a queued copy never resurrects a
					// removal.
					Remove(lt.Tier, job.key)
				}
			}
		}
		m.arena.Unref(job.id)
		m.trimQuota(job.key)
		lt.inflight[job.gen].Add(-1)
		lt.pending.Add(-1)
	}
}

// put writes one job's chunk to t, naming its parent when t is a
// ChainPutter and the parent is known.
func put(t Tier, job writeJob, data []byte) error {
	if cp, ok := t.(ChainPutter); ok && job.up.ok {
		return cp.PutAfter(context.Background(), job.key, job.up.parent, data)
	}
	return t.Put(context.Background(), job.key, data)
}

// writeFailed counts a refused write and logs the first of a run: a store
// that is down refuses every write, and one line per chunk stored would
// flood the log for as long as it stays down.
func (m *Manager) writeFailed(lt *lowerTier, k chunk.Key, err error) {
	if errors.Is(err, ErrRangeOpen) {
		return // deferred, not refused: the caller counted it missed
	}
	lt.failed.Add(1)
	lt.failing.Store(true)
	lt.failLog.Log("tier", lt.Name(), "key", k, "err", err)
}

// writeSucceeded ends a run of failed writes.
func (m *Manager) writeSucceeded(lt *lowerTier) {
	if lt.failing.Load() && lt.failing.Swap(false) {
		m.opts.Logger.Info("lower tier writes succeed again", "tier", lt.Name(), "failed_total", lt.failed.Load())
	}
}

// Acquire refs the RAM objects of the leading keys stored anywhere in the
// hierarchy, promoting lower-tier hits into RAM, and returns how many it
// acquired. ids must have room for len(keys), which are consecutive
// chunks of one prompt (promoted chunks are admitted as each other's
// children). The caller Unrefs each id on Arena(). This is the zero-copy read path. A lower tier that fails a read
// ends the prefix there without an error: the caller recomputes the rest.
func (m *Manager) Acquire(ctx context.Context, keys []chunk.Key, ids []arena.ID) (int, error) {
	return m.acquire(ctx, keys, ids, len(m.lower))
}

// AcquireLocal is Acquire from RAM and the NodeLocal tiers only: what a
// daemon serves a peer, which has its own remote stores and must never be
// asked back by this daemon's P2P tier on its behalf.
func (m *Manager) AcquireLocal(ctx context.Context, keys []chunk.Key, ids []arena.ID) (int, error) {
	return m.acquire(ctx, keys, ids, m.local)
}

// acquire is Acquire over RAM and the first upTo lower tiers.
func (m *Manager) acquire(ctx context.Context, keys []chunk.Key, ids []arena.ID, upTo int) (int, error) {
	n := m.ram.Acquire(keys, ids)
	if n == len(keys) || upTo == 0 {
		return n, nil
	}
	var first link
	if n > 0 {
		first = link{keys[n-1], true}
	}
	got, err := m.promote(ctx, first, keys[n:], ids[n:], upTo)
	return n + got, err
}

// Retrieve copies the leading stored chunks into dst (dst[i] is resliced
// to the chunk's length) and returns how many it copied. A dst[i] shorter
// than its chunk is an error.
func (m *Manager) Retrieve(ctx context.Context, keys []chunk.Key, dst [][]byte) (int, error) {
	if len(dst) < len(keys) {
		return 0, fmt.Errorf("tier manager: %d keys but %d buffers", len(keys), len(dst))
	}
	idsp := m.idPool.Get().(*[retrieveWindow]arena.ID)
	defer m.idPool.Put(idsp)
	// Work in windows: acquire, copy out, release. Promoted chunks then
	// need RAM for one window at a time, not for the whole prefix.
	done := 0
	for done < len(keys) {
		want := min(retrieveWindow, len(keys)-done)
		n, err := m.Acquire(ctx, keys[done:done+want], idsp[:want])
		copied, cerr := m.copyOut(idsp[:n], dst[done:done+n])
		done += copied
		if err = errors.Join(err, cerr); err != nil || copied < want {
			return done, err
		}
	}
	return done, nil
}

// retrieveWindow is how many chunks Retrieve holds at once.
const retrieveWindow = 32

// copyOut copies the objects ids into dst in order, drops the references
// and returns how many it copied before a buffer was too short.
func (m *Manager) copyOut(ids []arena.ID, dst [][]byte) (int, error) {
	copied := len(ids)
	var err error
	for i, id := range ids {
		src := m.arena.Bytes(id)
		if i < copied && len(dst[i]) < len(src) {
			err = fmt.Errorf("tier manager: buffer holds %d bytes, chunk has %d", len(dst[i]), len(src))
			copied = i
		}
		if i < copied {
			dst[i] = dst[i][:copy(dst[i], src)]
		}
		m.arena.Unref(id)
	}
	return copied, err
}

// promote refs the leading keys stored anywhere into ids: keys in RAM
// directly, keys held only by lower tiers by reading them into new RAM
// objects, up to FetchParallel reads at a time. RAM is reserved in key
// order before each read starts, so when RAM runs out the prefix simply
// ends there: that is a shorter hit, not an error. So is a lower tier
// that fails a read (readFailure). It returns the length of the prefix it
// acquired.
func (m *Manager) promote(ctx context.Context, first link, keys []chunk.Key, ids []arena.ID, upTo int) (int, error) {
	errs := make([]error, len(keys))
	sem := make(chan struct{}, m.opts.FetchParallel)
	var wg sync.WaitGroup
	var stop error // why launching stopped early, if it was an error
	n := 0
	for ; n < len(keys); n++ {
		// The caller has just found keys[0] missing from RAM; checking it
		// again would count the same miss twice.
		if n > 0 && m.ram.Acquire(keys[n:n+1], ids[n:n+1]) == 1 {
			continue
		}
		t := m.holder(keys[n], upTo)
		if t < 0 {
			break
		}
		size, ok := m.lower[t].Size(keys[n])
		if !ok {
			break
		}
		id, buf, err := m.ram.Reserve(size)
		if err != nil {
			if !errors.Is(err, arena.ErrNoSpace) && !errors.Is(err, ErrTooLarge) {
				stop = err
			}
			break
		}
		ids[n] = id
		sem <- struct{}{}
		wg.Add(1)
		go func(i int) {
			defer func() { <-sem; wg.Done() }()
			errs[i] = m.fill(ctx, keys[i], parentOf(keys, i, first), t, id, buf)
		}(n)
	}
	wg.Wait()
	got := 0
	for got < n && errs[got] == nil {
		got++
	}
	for i := got; i < n; i++ { // drop what lies past the first failure
		if errs[i] == nil {
			m.arena.Unref(ids[i])
		}
	}
	if got < n {
		return got, m.readFailure(ctx, errs[got])
	}
	return got, stop
}

// readFailure decides what a failed lower-tier read means to the caller.
// A lower tier is a cache: whatever went wrong in it (a store that timed
// out, refused or reset the connection, answered garbage) only ends the
// prefix there, so the engine recomputes those chunks. Only the caller's
// own cancellation is its error.
func (m *Manager) readFailure(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrCorrupt) {
		m.readFailed.Add(1)
		if m.opts.Logger.Enabled(ctx, slog.LevelDebug) {
			m.opts.Logger.Debug("lower tier read failed: served as a miss", "err", err)
		}
	}
	return nil
}

// lowerMissing reports whether some lower tier lacks k.
func (m *Manager) lowerMissing(k chunk.Key) bool {
	for _, lt := range m.lower {
		if !lt.readOnly && !Contains(lt.Tier, k) {
			return true
		}
	}
	return false
}

// holder returns the index in m.lower of the first of the first upTo
// lower tiers holding k, or -1.
func (m *Manager) holder(k chunk.Key, upTo int) int {
	for i, lt := range m.lower[:upTo] {
		if Contains(lt.Tier, k) {
			return i
		}
	}
	return -1
}

// fill reads k from lower tier t into the reserved RAM object id (buf is
// its bytes) and commits it. On failure it drops the reservation. A hit in
// a tier below the first lower tier is also offered to the tiers above it,
// without waiting: a read never waits for write backpressure.
func (m *Manager) fill(ctx context.Context, k chunk.Key, up link, t int, id arena.ID, buf []byte) error {
	lt := m.lower[t]
	n, err := lt.Get(ctx, k, buf)
	if err == nil && n != len(buf) {
		err = fmt.Errorf("tier %s: read %d bytes of %d: %w", lt.Name(), n, len(buf), ErrCorrupt)
	}
	if err != nil {
		m.arena.Unref(id)
		return err
	}
	m.ram.CommitAfter(k, up.parent, up.ok, id)
	m.promoted.Add(1)
	if t > 0 {
		m.mu.RLock()
		if !m.closed {
			m.enqueueWrites(k, up, id, t, &writeBudget{wait: -1})
		}
		m.mu.RUnlock()
	}
	return nil
}

// Prefetch asks for keys to be promoted into RAM in the background. It
// never blocks; a prefetch that finds the queue full is dropped.
func (m *Manager) Prefetch(keys []chunk.Key) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed || len(keys) == 0 {
		return false
	}
	select {
	case m.prefetch <- append([]chunk.Key(nil), keys...):
		return true
	default:
		m.prefetchDropped.Add(1)
		return false
	}
}

func (m *Manager) prefetcher() {
	defer m.wg.Done()
	for keys := range m.prefetch {
		if m.stopping.Load() {
			continue // drain without reading: Close is waiting
		}
		ids := make([]arena.ID, len(keys))
		n, _ := m.Acquire(context.Background(), keys, ids)
		for _, id := range ids[:n] {
			m.arena.Unref(id)
		}
	}
}

// Remove deletes key from every tier and reports whether any held it.
func (m *Manager) Remove(key chunk.Key) bool {
	found := m.ram.Remove(key)
	for _, lt := range m.lower {
		found = Remove(lt.Tier, key) || found
		lt.missed.forget(func(k chunk.Key) bool { return k == key })
		lt.gone.forget(func(k chunk.Key) bool { return k == key })
	}
	return found
}

// Clear removes every chunk of scope (all chunks when scope is 0) from RAM
// and from each lower tier that can enumerate and delete its keys (Lister
// and Remover), and returns how many each tier removed, in tier order.
// Tiers that cannot (shared remote stores) keep theirs; notCleared names
// them.
func (m *Manager) Clear(scope uint64) (removed []int, notCleared []string) {
	removed = make([]int, 1+len(m.lower))
	removed[0] = m.ram.Clear(scope)
	var keys []chunk.Key
	for _, lt := range m.lower {
		lt.missed.forgetScope(scope)
		lt.gone.forgetScope(scope)
	}
	for i, lt := range m.lower {
		l, ok := lt.Tier.(Lister)
		if _, canRemove := lt.Tier.(Remover); !ok || !canRemove {
			notCleared = append(notCleared, lt.Name())
			continue
		}
		keys = keys[:0]
		l.List(scope, func(k chunk.Key, _ int) bool { keys = append(keys, k); return true })
		for _, k := range keys {
			if Remove(lt.Tier, k) {
				removed[i+1]++
			}
		}
	}
	return removed, notCleared
}

// Size returns the length of key's object in the fastest tier holding it.
func (m *Manager) Size(key chunk.Key) (int, bool) { return m.size(key, len(m.lower)) }

// SizeLocal is Size over RAM and the NodeLocal tiers only.
func (m *Manager) SizeLocal(key chunk.Key) (int, bool) { return m.size(key, m.local) }

func (m *Manager) size(key chunk.Key, upTo int) (int, bool) {
	if n, ok := m.ram.Size(key); ok {
		return n, true
	}
	for _, lt := range m.lower[:upTo] {
		if n, ok := lt.Size(key); ok {
			return n, true
		}
	}
	return 0, false
}

// QueueStats describes one lower tier's write queue.
type QueueStats struct {
	Tier     string
	Depth    int    // writes pending now
	Capacity int    // QueueDepth
	Dropped  uint64 // writes dropped on a full queue
	Failed   uint64 // writes the tier refused
	// LayerSaved counts the records a per-layer save wrote by ranges and
	// committed; LayerBytes the bytes of layers it gave to range writes
	// before their commit (LayerSave).
	LayerSaved uint64
	LayerBytes uint64
}

// Stats returns each tier's stats, RAM first, and each lower tier's queue.
func (m *Manager) Stats() ([]Stats, []QueueStats) {
	st := []Stats{m.ram.Stats()}
	var qs []QueueStats
	for _, lt := range m.lower {
		st = append(st, StatsOf(lt.Tier))
		qs = append(qs, QueueStats{Tier: lt.Name(), Depth: len(lt.queue), Capacity: cap(lt.queue), Dropped: lt.dropped.Load(), Failed: lt.failed.Load(),
			LayerSaved: lt.layerSaved.Load(), LayerBytes: lt.layerBytes.Load()})
	}
	return st, qs
}

// Promoted returns how many objects were promoted from lower tiers.
func (m *Manager) Promoted() uint64 { return m.promoted.Load() }

// ReadFailed returns how many lower-tier reads failed (for reasons other
// than a missing or corrupt object) and were served as misses.
func (m *Manager) ReadFailed() uint64 { return m.readFailed.Load() }

// ErrNotDurable is wrapped by Flush's error when some stored chunk is not
// in every lower tier that takes writes.
var ErrNotDurable = errors.New("tier manager: stored chunks missing from a lower tier")

// Flush waits until every queued lower-tier write has been attempted,
// then writes again, as Sync does, the chunks whose write was dropped on
// a full queue or refused (a remote tier's breaker deadline included).
// It returns nil only when every chunk stored before it is in every
// lower tier that takes writes; otherwise an error wrapping ErrNotDurable
// that names the tiers and counts, or ctx's error.
func (m *Manager) Flush(ctx context.Context) error {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		var pending int64
		for _, lt := range m.lower {
			pending += lt.pending.Load()
		}
		if pending == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	// A refused or dropped write is not retried by the writers: without
	// this, Flush returned nil while the tier lacked the chunk.
	rep, err := m.Sync(ctx)
	if err != nil {
		return err
	}
	var short []string
	for _, t := range rep {
		if t.Pending > 0 || t.Missing > 0 {
			short = append(short, fmt.Sprintf("%s: %d missing, %d pending", t.Tier, t.Missing, t.Pending))
		}
	}
	if short != nil {
		return fmt.Errorf("%w: %s", ErrNotDurable, strings.Join(short, "; "))
	}
	return nil
}

// Close stops accepting work, finishes queued writes, and closes every
// tier. The arena stays with its owner.
func (m *Manager) Close() error {
	// Before the lock: a reservation waiting for its owner's quota holds
	// the read lock, and gives up when it sees this.
	m.stopping.Store(true)
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	for _, lt := range m.lower {
		close(lt.queue)
	}
	close(m.prefetch)
	m.mu.Unlock()
	m.wg.Wait()
	err := m.ram.Close()
	for _, lt := range m.lower {
		err = errors.Join(err, Close(lt.Tier))
	}
	return err
}
