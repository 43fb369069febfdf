// Package disk is kvtier's persistent local-disk tier: a log-structured
// store of KV chunks that survives restarts and crashes.
//
// Chunks are appended as self-describing records (see FORMAT in format.go)
// to segment files in one directory. Each record carries its key, its
// location and checksums of header and payload, so the in-memory index can
// be rebuilt after a restart by reading only the header blocks — and only
// those written after the last checkpoint of the index (checkpoint.go),
// which the tier writes every few thousand records and at Close — and no torn,
// misplaced or bit-rotted record is ever handed out: every Get verifies the
// payload against its xxh3 checksum and drops a record that fails.
//
// Records are padded to 4096 bytes so that, where the file system allows,
// all I/O is O_DIRECT straight between the caller's (page-aligned, usually
// shared-memory) buffer and the device. A Put writes the payload with one
// pwritev while it checksums the same bytes, then the header block; a Get
// reads header and payload with one preadv, a large payload in pieces read
// in parallel, checksumming each piece while later ones are read. A Put
// returns only after its record is durable (fdatasync, shared by concurrent
// Puts) unless the options trade that away; only then does the record
// become visible.
//
// Space is freed one record at a time by punching holes into the segment
// files, so eviction can follow any policy's order (package policy; LRU
// unless Options.Policy names another) without compaction, and the
// bytes the files occupy never exceed the capacity: a Put reserves its
// record's padded size first and waits for evictions' punches to finish
// before writing; Puts also evict a little ahead (Options.Headroom) so that
// they rarely wait. A segment whose records are all gone is deleted. Every
// punch is fsync'ed, and Remove returns only once every copy of its key is
// durably gone, so removed data never reappears.
//
// I/O runs on a few goroutines fed by priority queues (reads, then deletes,
// then writes); no lock is held across I/O. A pin is a deadline on a
// record: eviction passes the record by until the deadline has passed.
//
// A file system that fills up before the tier reaches its capacity makes
// it evict to fit, when its own records filled it, or turn read-only until
// there is room again (space.go).
package disk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"kvtier/chunk"
	"kvtier/internal/ratelog"
	"kvtier/tier"
	"kvtier/tier/policy"
)

// DirectMode says whether segment files use O_DIRECT.
type DirectMode int

const (
	// DirectAuto uses O_DIRECT where the file system accepts it and
	// buffered I/O where it refuses it.
	DirectAuto DirectMode = iota
	// DirectOn requires O_DIRECT: Open fails where it is refused.
	DirectOn
	// DirectOff uses the page cache.
	DirectOff
)

// SyncMode says when written records are flushed to stable storage.
type SyncMode int

const (
	// SyncEach makes every record durable (fdatasync) before its Put
	// returns; Puts that finish together share one fdatasync. A crash
	// never loses an acknowledged Put.
	SyncEach SyncMode = iota
	// SyncNone leaves flushing to the operating system (and to Close). A
	// power failure or kernel crash may lose acknowledged Puts (a process
	// crash does not); none makes a Get return wrong bytes.
	SyncNone
)

// DefaultCheckpointRecords bounds the log a restart after a crash reads
// header by header: about 4096 × 85 µs = 0.35 s on the 2-core machine of
// docs/scale.md, while a checkpoint of a million records (40 MB) every 4096
// stored chunks adds about 10 KB per stored chunk, under 1% of a chunk.
const DefaultCheckpointRecords = 4096

// Options configure a Tier. Zero values take the defaults noted.
type Options struct {
	Capacity    int64      // bytes the segment files may occupy; required
	SegmentSize int64      // bytes per segment file before a new one starts; default 256 MiB
	DirectIO    DirectMode // default DirectAuto
	Sync        SyncMode   // default SyncEach
	// Headroom is how many bytes Puts keep free by evicting ahead of need,
	// so that the next Put finds its space already punched out instead of
	// waiting for it (freeing blocks can take milliseconds). Default
	// Capacity/64, at most 256 MiB; negative means none: evict only on
	// demand.
	Headroom   int64
	QueueDepth int // I/O goroutines, i.e. I/Os in flight; default 2
	BounceSize int // per-goroutine staging for unaligned buffers; default 1 MiB
	// Policy names the eviction policy (policy.Names); default
	// policy.Default. The order does not persist: after a restart records
	// enter the policy in log order, oldest first, as roots.
	Policy string
	// CheckpointRecords is how many records may be stored after the last
	// checkpoint of the index before the next one is written, which bounds
	// what Open must scan after a crash (checkpoint.go); default
	// DefaultCheckpointRecords, negative: no checkpoints at all, Open
	// scans every segment.
	CheckpointRecords int
	// CheckpointInterval also writes a checkpoint this often when the
	// index changed; default one minute, negative: only by count and at
	// Close.
	CheckpointInterval time.Duration
	Logger             *slog.Logger
}

func (o Options) withDefaults() (Options, error) {
	if o.Capacity <= 0 {
		return o, fmt.Errorf("disk: capacity %d must be positive", o.Capacity)
	}
	if o.SegmentSize <= 0 {
		o.SegmentSize = 256 << 20
	}
	o.SegmentSize = alignUp(o.SegmentSize)
	if o.Headroom == 0 {
		o.Headroom = min(o.Capacity/64, 256<<20)
	}
	o.Headroom = max(o.Headroom, 0)
	if o.QueueDepth <= 0 {
		o.QueueDepth = 2
	}
	if o.BounceSize <= 0 {
		o.BounceSize = 1 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.CheckpointRecords == 0 {
		o.CheckpointRecords = DefaultCheckpointRecords
	}
	if o.CheckpointInterval == 0 {
		o.CheckpointInterval = time.Minute
	}
	switch {
	case o.DirectIO < DirectAuto || o.DirectIO > DirectOff:
		return o, fmt.Errorf("disk: unknown direct I/O mode %d", o.DirectIO)
	case o.Sync < SyncEach || o.Sync > SyncNone:
		return o, fmt.Errorf("disk: unknown sync mode %d", o.Sync)
	}
	return o, nil
}

// Tier is the disk tier. Besides tier.Tier it implements every optional
// interface of a tier: Container, PrefixContainer, Remover, Pinner,
// Lister, Observable, StatsReporter and io.Closer.
type Tier struct {
	dir    string
	opts   Options
	log    *slog.Logger
	lockFD int
	direct bool
	start  time.Time // origin of the pin clock
	sched  *sched
	ops    opPool
	calls  sync.WaitGroup

	mu       sync.Mutex
	space    sync.Cond           // broadcast when bytes are freed, writes finish or punches end
	ghosts   map[chunk.Key]int32 // copies of a key whose punch has not yet been made durable
	obs      atomic.Pointer[observerBox]
	closed   bool
	idx      *index
	segs     map[uint64]*segment
	active   *segment // segment new records go to; nil until the first Put
	nextSeg  uint64
	used     int64 // bytes reserved: live + being written + waiting for a punch + leaked
	writing  int64 // bytes of Puts in flight, open range writes included
	punching int64 // bytes of punches queued or running
	st       tier.Stats

	// Range writes open between two ranges (rangewrite.go): their end is
	// up to a client (a commit, or a lease lapsing, minutes away), so
	// nothing waits for them; opened maps their keys to their bytes.
	opened      map[chunk.Key]int64
	openedBytes int64

	// Room on the file system: see space.go.
	room      Space
	nextCheck int64         // tier clock time of the next look at the file system
	checking  bool          // a look is under way
	unprobed  bool          // opened on a full file system: probe before writing
	recheck   time.Duration // recheckEvery; tests shorten it
	logs      spaceLogs
	corrupt   ratelog.Set // one line per damaged record read: a bad disk has many

	// Checkpoints: see checkpoint.go.
	rec       Recovery
	recStart  time.Time         // when Open began recovering
	ckptMu    sync.Mutex        // one checkpoint at a time
	ckptBuf   []slot            // reused snapshot space, under ckptMu
	ckptPuts  int               // records stored since the last snapshot, under mu
	ckptDirty bool              // the index changed since the last snapshot, under mu
	ckptKick  chan struct{}     // wakes the checkpointer early
	ckptStop  chan struct{}     // closed by Close
	ckptDone  chan struct{}     // closed when the checkpointer has stopped
	ckptHook  func(step string) // tests: called between the steps of writing
}

var (
	_ tier.Tier            = (*Tier)(nil)
	_ tier.Container       = (*Tier)(nil)
	_ tier.PrefixContainer = (*Tier)(nil)
	_ tier.Remover         = (*Tier)(nil)
	_ tier.Pinner          = (*Tier)(nil)
	_ tier.Lister          = (*Tier)(nil)
	_ tier.Observable      = (*Tier)(nil)
	_ tier.StatsReporter   = (*Tier)(nil)
	_ tier.ChainPutter     = (*Tier)(nil)
	_ io.Closer            = (*Tier)(nil)
)

// Open opens (creating if needed) the tier in dir, rebuilding its index from
// the segment files and repairing whatever a crash left behind.
func Open(dir string, opts Options) (*Tier, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	order, err := policy.New[chunk.Key](opts.Policy)
	if err != nil {
		return nil, fmt.Errorf("disk: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("disk: create %s: %w", dir, err)
	}
	lockFD, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	direct, err := probe(dir, opts.DirectIO)
	unprobed := false
	if isNoSpace(err) {
		// Too full for the probe's test writes: open read-only and serve
		// what is there (space.go).
		direct, err = probeFull(dir, opts.DirectIO)
		unprobed = err == nil
	}
	if err != nil {
		unix.Close(lockFD)
		return nil, err
	}
	t := &Tier{
		dir:    dir,
		opts:   opts,
		log:    opts.Logger.With("tier", "disk", "dir", dir),
		lockFD: lockFD,
		direct: direct,
		start:  time.Now(),
		idx:    newIndex(order),
		segs:   make(map[uint64]*segment),
		ghosts: make(map[chunk.Key]int32),
		opened: make(map[chunk.Key]int64),
	}
	t.space.L = &t.mu
	t.st.Name = t.Name()
	t.st.Capacity = opts.Capacity
	t.room.Capacity = opts.Capacity
	t.recheck = recheckEvery
	t.logs = newSpaceLogs(t.log)
	if err := t.recover(); err != nil {
		t.closeFiles()
		return nil, err
	}
	if unprobed {
		t.room.ReadOnly, t.room.NoSpace, t.unprobed = true, 1, true
		t.logs.readOnly.Log("at_open", true)
	}
	t.sched = newSched(opts.QueueDepth, opts.BounceSize, t.exec)
	t.startCheckpointer()
	return t, nil
}

// Policy returns the canonical name of the eviction policy (policy.Names).
func (t *Tier) Policy() string { return t.idx.order.Name() }

// DirectIO reports whether the segment files use O_DIRECT.
func (t *Tier) DirectIO() bool { return t.direct }

// Name implements tier.Tier.
func (t *Tier) Name() string { return "disk" }

// NodeLocal implements tier.NodeLocal: the daemon serves its peers from
// this tier.
func (t *Tier) NodeLocal() {}

// Contains implements tier.Container.
func (t *Tier) Contains(key chunk.Key) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.idx.liveSlot(key)
	return ok
}

// PrefixContains implements tier.PrefixContainer.
func (t *Tier) PrefixContains(keys []chunk.Key) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	for n, k := range keys {
		if _, ok := t.idx.liveSlot(k); !ok {
			return n
		}
	}
	return len(keys)
}

// Size implements tier.Tier.
func (t *Tier) Size(key chunk.Key) (int, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.idx.liveSlot(key)
	if !ok {
		return 0, false
	}
	return int(t.idx.slots[i].size), true
}

// Pin implements tier.Pinner. A pin only moves a record's deadline later.
func (t *Tier) Pin(keys []chunk.Key, ttl time.Duration) int {
	now := t.now()
	until := now + int64(ttl)
	if ttl > 0 && until < now { // overflow: a pin for all practical time
		until = math.MaxInt64
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for n, k := range keys {
		i, ok := t.idx.liveSlot(k)
		if !ok {
			return n
		}
		s := &t.idx.slots[i]
		s.pinUntil = max(s.pinUntil, until)
	}
	return len(keys)
}

// Stats implements tier.StatsReporter. It walks the index to sum pinned bytes, so it
// is meant for periodic scraping, not for hot paths.
func (t *Tier) Stats() tier.Stats {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.st
	st.Used = t.used
	st.Objects = int64(t.idx.live)
	for i := range t.idx.slots {
		if s := &t.idx.slots[i]; s.state == slotLive && s.pinUntil > now {
			st.Pinned += recordSize(s.size)
		}
	}
	return st
}

// List implements tier.Lister.
func (t *Tier) List(scope uint64, fn func(chunk.Key, int) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.idx.slots {
		s := &t.idx.slots[i]
		if s.state == slotLive && (scope == 0 || s.key.Scope == scope) && !fn(s.key, int(s.size)) {
			return
		}
	}
}

// Put implements tier.Tier. It returns once the record is written and, with
// SyncEach, durable. Reserving space may wait for evictions to free it; if
// everything evictable is pinned, Put fails with tier.ErrBusy. A full file
// system makes the tier evict to fit or turn read-only (see space.go); a
// read-only tier fails Puts with ErrReadOnly.
func (t *Tier) Put(ctx context.Context, key chunk.Key, data []byte) error {
	return t.putAfter(ctx, key, parent{}, data)
}

// PutAfter implements tier.ChainPutter: it is Put for a chunk whose parent
// in its prefix chain is up, which a prefix-aware policy keeps while the
// chunk is stored. The record's header names the parent (of the same key
// scope; FORMAT in format.go), and so does the checkpoint, so that after a
// restart the policy takes the chains in again.
func (t *Tier) PutAfter(ctx context.Context, key, up chunk.Key, data []byte) error {
	return t.putAfter(ctx, key, parent{up, true}, data)
}

// parent is a record's parent in its prefix chain, when known.
type parent struct {
	key chunk.Key
	ok  bool
}

func (t *Tier) putAfter(ctx context.Context, key chunk.Key, up parent, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	need := recordSize(int64(len(data)))
	if need > t.opts.Capacity {
		return fmt.Errorf("disk: put %v: %d bytes on disk: %w", key, need, tier.ErrTooLarge)
	}
	t.waitQueueRoom()
	err := t.put(ctx, key, up, data, need)
	if isNoSpace(err) && t.noSpace(need, err) {
		// The capacity in force was lowered to what the file system
		// holds: try once more, evicting down to it.
		if err = t.put(ctx, key, up, data, need); isNoSpace(err) {
			t.noSpace(need, err)
		}
	}
	return err
}

// put makes one attempt at storing a need-byte record.
func (t *Tier) put(ctx context.Context, key chunk.Key, up parent, data []byte, need int64) error {
	if stored, err := t.enter(key); stored || err != nil {
		return err
	}
	defer t.calls.Done()
	if err := t.admit(); err != nil {
		return fmt.Errorf("disk: put %v: %w", key, err)
	}

	t.mu.Lock()
	r, err := t.reserveLocked(nil, key, int64(len(data)), need)
	r.up = up
	t.mu.Unlock()
	if err != nil || r.seg == nil {
		return err
	}
	seg := r.seg
	if r.fresh {
		t.createSegment(seg)
	}
	<-seg.ready
	if err = seg.openErr; err == nil {
		err = t.write(ctx, seg, r.off, key, up, data)
	}
	if err == nil && t.opts.Sync == SyncEach {
		err = seg.sync.sync(seg.fd)
	}
	t.finishPut(r, len(data), err)
	if err != nil {
		return fmt.Errorf("disk: put %v in segment %d: %w", key, seg.id, err)
	}
	return nil
}

// write stores a record in two steps: an I/O goroutine writes the payload
// while this one checksums it, then the header follows. Overlapping the
// checksum with the transfer hides its cost; writing the header last means a
// valid header is never found before its payload was written.
func (t *Tier) write(ctx context.Context, seg *segment, off int64, key chunk.Key, up parent, data []byte) error {
	o := t.getOp()
	defer t.putOp(o)
	o.kind, o.seg, o.off, o.buf = opWrite, seg, off, data
	t.sched.submit(o)
	h := &o.hdr // 2 KiB of piece checksums: kept with the pooled op, off the stack
	*h = header{seg: seg.id, off: off, key: key, size: int64(len(data))}
	h.setSums(data)
	h.setParent(up)
	if err := t.sched.wait(ctx, o); err != nil {
		return err
	}
	if o.err != nil {
		return o.err
	}
	if o.block == nil {
		o.block = alignedBuf(blockSize) // kept with the pooled op
	}
	return writeHeader(seg.fd, o.block, h)
}

// reservation is the space a Put holds while it writes.
type reservation struct {
	key   chunk.Key
	slot  int32
	seg   *segment // nil: nothing reserved, the key is stored already
	off   int64
	need  int64 // bytes on disk
	fresh bool  // seg is new: this Put creates its file
	up    parent
}

// enter registers a Put call unless the tier is closed or key is already
// stored. On (false, nil) the caller must call t.calls.Done.
func (t *Tier) enter(key chunk.Key) (stored bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false, tier.ErrClosed
	}
	if _, ok := t.idx.liveSlot(key); ok {
		return true, nil
	}
	t.calls.Add(1)
	return false, nil
}

// reserveLocked makes room for a need-byte record, evicting the policy's
// victims as needed, and places it. The reservation is empty if key
// was stored meanwhile. If another Put of key is writing it, this one waits
// for the outcome rather than report as stored a record that may yet fail;
// if an open range write holds key, it fails with tier.ErrRangeOpen
// instead, and the caller redoes the write later (tier.Manager's Sync).
//
// A range write reserves with ranged set (OpenWrite): it waits only for
// the punches of evictions, which end on their own, and only until ranged
// ends; where a Put would wait for writes in flight, or key is being
// written, it gets an empty reservation and no error, and its chunk is
// written whole at the commit. It must not wait for writes: its own save's
// open range writes count among them.
func (t *Tier) reserveLocked(ranged context.Context, key chunk.Key, size, need int64) (reservation, error) {
	for {
		if t.closed {
			return reservation{}, tier.ErrClosed
		}
		if ranged != nil && ranged.Err() != nil {
			return reservation{}, nil
		}
		if i, ok := t.idx.get(key); ok {
			if t.idx.slots[i].state == slotLive || ranged != nil {
				return reservation{}, nil
			}
			if _, open := t.opened[key]; open {
				return reservation{}, fmt.Errorf("disk: put %v: %w", key, tier.ErrRangeOpen)
			}
			t.space.Wait() // finishPut broadcasts
			continue
		}
		limit := t.room.Capacity
		if need > limit {
			return reservation{}, fmt.Errorf("disk: put %v: %d bytes on disk, the file system holds %d for the tier: %w",
				key, need, limit, tier.ErrTooLarge)
		}
		if err := t.quotaRoomLocked(key, need); err != nil {
			return reservation{}, err
		}
		if t.used+need <= limit {
			break
		}
		if t.used-t.punching+need > limit && t.waitPolicyLocked() {
			continue // evicting needs the policy; the tier may have changed meanwhile
		}
		// Evict only what the punches already under way will not free.
		if t.used-t.punching+need > limit && t.evictOneLocked() {
			continue
		}
		// Open range writes end when a client says so: waiting for them
		// could take minutes, or forever when it is this caller's own save.
		inFlight := t.writing - t.openedBytes
		if ranged != nil {
			inFlight = 0
		}
		if t.punching == 0 && inFlight == 0 {
			if ranged != nil {
				return reservation{}, nil
			}
			return reservation{}, fmt.Errorf("disk: put %v: %d of %d bytes pinned or held by open range writes: %w",
				key, t.used, limit, tier.ErrBusy)
		}
		t.space.Wait()
	}
	t.used += need
	t.writing += need
	t.keepHeadroomLocked()
	r := reservation{key: key, need: need}
	r.seg, r.fresh = t.placeLocked(need)
	r.off = r.seg.tail - need
	r.slot = t.idx.add(slot{key: key, seg: r.seg.id, off: r.off, size: size})
	return r, nil
}

// placeLocked appends need bytes to the active segment, starting a new one
// when the record does not fit. A record larger than a segment gets a
// segment of its own.
func (t *Tier) placeLocked(need int64) (seg *segment, fresh bool) {
	seg = t.active
	if seg == nil || seg.failed || (seg.tail > 0 && seg.tail+need > t.opts.SegmentSize) {
		if seg != nil {
			t.active = nil
			t.retireIfEmptyLocked(seg)
		}
		seg = &segment{id: t.nextSeg, fd: -1, ready: make(chan struct{})}
		seg.path = filepath.Join(t.dir, segmentName(seg.id))
		t.nextSeg++
		t.segs[seg.id] = seg
		t.active = seg
		fresh = true
	}
	seg.tail += need
	seg.live++
	return seg, fresh
}

// createSegment creates seg's file, and makes its name durable before any
// record in it can be acknowledged.
func (t *Tier) createSegment(seg *segment) {
	defer close(seg.ready)
	fd, err := openFile(seg.path, openFlags(t.direct)|unix.O_CREAT|unix.O_EXCL, 0o644)
	if err != nil {
		seg.openErr = fmt.Errorf("create %s: %w", seg.path, err)
		return
	}
	if err := syncDir(t.dir); err != nil {
		unix.Close(fd)
		seg.openErr = fmt.Errorf("sync directory %s: %w", t.dir, err)
		return
	}
	seg.fd = fd
}

// finishPut publishes a written record, or gives its space back.
func (t *Tier) finishPut(r reservation, n int, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	defer t.space.Broadcast()
	t.writing -= r.need
	if err == nil {
		t.idx.publishAfter(r.slot, r.up)
		t.notePutLocked()
		t.st.Puts++
		t.st.BytesWritten += uint64(n)
		if o := t.observer(); o != nil {
			o.Admitted(t.Name(), r.key)
		}
		return
	}
	t.idx.drop(r.slot)
	seg := r.seg
	if seg.openErr != nil || seg.sync.failed() {
		seg.failed = true
	}
	if seg.openErr != nil { // nothing was written
		t.used -= r.need
		seg.live--
		t.retireIfEmptyLocked(seg)
		return
	}
	t.punchLocked(seg, r.off, r.need, r.key) // part or all of it may have reached the disk
}

// Get implements tier.Tier. dst must hold at least Size(key) bytes.
func (t *Tier) Get(ctx context.Context, key chunk.Key, dst []byte) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	t.waitQueueRoom()
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return 0, tier.ErrClosed
	}
	i, ok := t.idx.liveSlot(key)
	if !ok {
		t.st.Misses++
		t.mu.Unlock()
		return 0, tier.ErrNotFound
	}
	loc := t.idx.slots[i]
	if int64(len(dst)) < loc.size {
		t.mu.Unlock()
		return 0, fmt.Errorf("disk: get %v: buffer of %d bytes for %d: %w", key, len(dst), loc.size, io.ErrShortBuffer)
	}
	seg := t.segs[loc.seg]
	seg.refs++
	t.idx.touch(i)
	t.calls.Add(1)
	t.mu.Unlock()
	defer t.calls.Done()

	r, err := t.read(ctx, seg, loc.off, dst[:loc.size])
	h := r.hdr
	var bad error // why the record is corrupt
	switch {
	case err != nil:
	case errors.Is(r.ioErr, io.ErrUnexpectedEOF): // the file was cut short
		bad = r.ioErr
	case r.ioErr != nil:
		err = fmt.Errorf("disk: get %v from segment %d: %w", key, seg.id, r.ioErr)
	case r.hdrErr != nil:
		bad = r.hdrErr
	case h.key != key || h.seg != loc.seg || h.off != loc.off || h.size != loc.size:
		bad = errMisplaced
	case !r.sumOK:
		bad = errPayloadSum
	}
	n, err := t.finishGet(key, loc, seg, err, bad)
	if errors.Is(err, tier.ErrCorrupt) {
		t.corrupt.Log(t.log, slog.LevelWarn, "dropped corrupt record", "key", key, "segment", loc.seg, "offset", loc.off, "err", bad)
	}
	return n, err
}

// A Get reads a large payload in pieces of pieceSize bytes, keeping up to
// readWindow of them submitted at once: one for each I/O goroutine at the
// default queue depth, and spares queued so that a worker finishing a
// piece finds the next one without waiting for the Get to submit it.
const (
	pieceSize  = 4 << 20
	readWindow = 4
)

// readResult is what reading a record found.
type readResult struct {
	hdr    header
	hdrErr error // why the header block was rejected
	ioErr  error // the first I/O error; the read stopped there
	sumOK  bool  // every piece matched its checksum; valid without errors
}

// read reads the record at off, whose payload fills payload, and checksums
// the payload. Hashing 32 MiB after reading it would add 15-20% to the
// read's time, so a payload larger than pieceSize is read as a run of piece
// ops that the I/O goroutines take in parallel, and each piece is hashed
// here, in order, as soon as it lands, while later ones are still being
// read: only the last piece is left to hash when the I/O ends. Keeping
// several pieces submitted matters: reading them one at a time leaves the
// device idle between pieces (10% slower than one large read here), two in
// flight are as fast as one large read. The streaming hasher gives the
// digest xxh3.Hash gives, which the format stores for each piece of the
// payload (pieceCheck).
//
// ctx acts on each piece as in sched.wait: a piece still queued is
// withdrawn, one a worker has is waited for, since it writes into payload.
// read returns an error only for ctx, and only with no piece in flight.
func (t *Tier) read(ctx context.Context, seg *segment, off int64, payload []byte) (readResult, error) {
	var (
		r      readResult
		check  pieceCheck
		window [readWindow]*op
		next   int // piece to submit next
	)
	r.sumOK = true
	pieces := max(1, (len(payload)+pieceSize-1)/pieceSize) // an empty payload still has its header read
	for i := range pieces {
		for ; next < min(pieces, i+readWindow); next++ {
			window[next%readWindow] = t.submitPiece(seg, off, payload, next)
		}
		o := window[i%readWindow]
		err := t.sched.wait(ctx, o)
		if err == nil {
			if i == 0 {
				r.hdr, r.hdrErr = o.hdr, o.hdrErr
				check.start(int64(len(payload)))
			}
			if r.ioErr = o.err; r.ioErr == nil && r.hdrErr == nil {
				r.sumOK = check.write(&r.hdr, o.buf) && r.sumOK
			}
		}
		t.putOp(o)
		if err != nil || r.ioErr != nil || r.hdrErr != nil { // the rest is of no use
			for j := i + 1; j < next; j++ {
				t.sched.cancel(window[j%readWindow])
				t.putOp(window[j%readWindow])
			}
			return r, err
		}
	}
	r.sumOK = check.finish(&r.hdr) && r.sumOK
	return r, nil
}

// submitPiece queues the read of piece i of the record at off; the first
// piece brings the header along.
func (t *Tier) submitPiece(seg *segment, off int64, payload []byte, i int) *op {
	from := i * pieceSize
	o := t.getOp()
	o.kind, o.seg, o.off, o.from = opRead, seg, off, int64(from)
	o.buf = payload[from:min(from+pieceSize, len(payload))]
	t.sched.submit(o)
	return o
}

// finishGet settles a Get's outcome. A record that failed validation is
// dropped, unless it had already left the index while we read it: then it
// was removed or evicted under us, and the reader simply missed it.
func (t *Tier) finishGet(key chunk.Key, loc slot, seg *segment, err, bad error) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	seg.refs--
	t.retireIfEmptyLocked(seg)
	switch {
	case err != nil:
		return 0, err
	case bad == nil:
		t.st.Hits++
		t.st.BytesRead += uint64(loc.size)
		return int(loc.size), nil
	}
	i, ok := t.idx.liveSlot(key)
	if !ok || t.idx.slots[i].seg != loc.seg || t.idx.slots[i].off != loc.off {
		t.st.Misses++
		return 0, tier.ErrNotFound
	}
	t.st.Corrupt++
	t.dropLocked(i)
	return 0, fmt.Errorf("disk: get %v at segment %d offset %d: %w: %w", key, loc.seg, loc.off, bad, tier.ErrCorrupt)
}

// Remove implements tier.Remover. It returns once every copy of key known to
// be on disk — this one, and any older copy still being evicted — has been
// punched out and the punch fsync'ed, so removed data stays gone after a
// crash. A Put still in flight for key is not affected.
func (t *Tier) Remove(key chunk.Key) bool {
	t.waitQueueRoom()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	i, ok := t.idx.liveSlot(key)
	if !ok {
		return false
	}
	t.st.Removes++
	t.dropLocked(i)
	t.calls.Add(1)
	defer t.calls.Done()
	for t.ghosts[key] > 0 {
		t.space.Wait()
	}
	return true
}

// Close implements io.Closer: it waits for calls in flight, runs queued
// punches, makes everything durable and releases the directory.
func (t *Tier) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.space.Broadcast()
	t.mu.Unlock()
	t.stopCheckpointer()
	t.calls.Wait()
	t.sched.close()
	t.finalCheckpoint()
	t.WaitPolicy() // the policy goroutine of Open is done
	return t.closeFiles()
}

// closeFiles syncs and closes every segment and unlocks the directory.
func (t *Tier) closeFiles() error {
	t.mu.Lock()
	segs := make([]*segment, 0, len(t.segs))
	for _, seg := range t.segs {
		if seg.fd >= 0 {
			segs = append(segs, seg)
		}
	}
	t.mu.Unlock()
	var errs []error
	for _, seg := range segs {
		if err := unix.Fsync(seg.fd); err != nil {
			errs = append(errs, fmt.Errorf("disk: sync %s: %w", seg.path, err))
		}
		unix.Close(seg.fd)
		seg.fd = -1
	}
	if t.lockFD >= 0 {
		unix.Close(t.lockFD)
		t.lockFD = -1
	}
	return errors.Join(errs...)
}

// exec runs one op on an I/O goroutine.
func (t *Tier) exec(w *worker, o *op) {
	switch o.kind {
	case opRead:
		o.err = w.readRecord(o.seg.fd, t.direct, o.off, o.from, o.buf)
		if o.err == nil && o.from == 0 {
			o.hdr, o.hdrErr = decodeHeader(w.hdr)
		}
	case opWrite:
		o.err = w.writePayload(o.seg.fd, t.direct, o.off, o.buf)
	case opPunch:
		t.execPunch(o)
	case opRetire:
		t.execRetire(o.seg)
	}
	if o.async {
		t.putOp(o)
		return
	}
	o.done <- struct{}{}
}

func (t *Tier) getOp() *op { return t.ops.get() }

func (t *Tier) putOp(o *op) { t.ops.put(o) }

// now is the pin clock: monotonic nanoseconds since Open.
func (t *Tier) now() int64 { return int64(time.Since(t.start)) }

// observerBox holds the observer for an atomic pointer.
type observerBox struct{ o tier.Observer }

// SetObserver implements tier.Observable. Records found on disk when the
// tier opened are not announced; only admissions and drops from now on.
func (t *Tier) SetObserver(o tier.Observer) { t.obs.Store(&observerBox{o}) }

func (t *Tier) observer() tier.Observer {
	if b := t.obs.Load(); b != nil {
		return b.o
	}
	return nil
}
