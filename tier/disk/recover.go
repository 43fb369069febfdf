package disk

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"kvtier/chunk"
	"kvtier/tier/policy"
)

// recover rebuilds the index from the segment files at Open. Records enter
// the eviction policy in log order, so after a restart the oldest go first
// (under LRU and FIFO), with one exception: the records of a segment the
// checkpoint does not vouch for enter after every record it restores (see
// restoreAll). Where a checkpoint vouches for a segment's records
// (checkpoint.go), only the part written after it is scanned. Torn tails
// are cut off, garbage between records is punched out, segments left
// without records are deleted, and if the files hold more than the
// capacity (it may have been lowered) the policy's victims are evicted.
func (t *Tier) recover() error {
	start := time.Now()
	t.recStart = start
	ids, err := listSegments(t.dir)
	if err != nil {
		return err
	}
	cp, err := t.takeCheckpoint()
	if err != nil {
		return err
	}
	var sum scanReport
	err = t.rebuild(ids, cp, &sum)
	if errors.Is(err, errCheckpoint) {
		// Only a checkpoint that lists a key twice gets this far, and
		// what restoring it changed a full scan would have changed too.
		t.log.Warn("checkpoint not used: scanning every segment", "err", err)
		if err = t.resetIndex(); err == nil {
			cp, sum = nil, scanReport{}
			err = t.rebuild(ids, nil, &sum)
		}
	}
	if err != nil {
		return err
	}
	t.rec.Checkpoint = cp != nil
	if t.idx.warm == nil {
		// No policy goroutine, or it was done before the log past the
		// checkpoint was indexed (pol left the links to here); else pol
		// links them, once the policy has every record.
		t.idx.adoptRestored()
	}
	evicted := 0
	for t.used > t.opts.Capacity {
		i := t.idx.victim(t.now())
		s := t.idx.slots[i]
		if err := t.dropNow(i); err != nil {
			return fmt.Errorf("disk: evict %v over capacity: %w", s.key, err)
		}
		evicted++
		t.st.Evictions++
	}
	deleted := false
	for id, seg := range t.segs {
		if seg.live > 0 {
			// Make the punches above durable: an older copy of a key
			// must not come back after a later Remove of it.
			if err := unix.Fsync(seg.fd); err != nil {
				return fmt.Errorf("disk: sync %s: %w", seg.path, err)
			}
			continue
		}
		unix.Close(seg.fd)
		if err := os.Remove(seg.path); err != nil {
			return fmt.Errorf("disk: delete empty segment: %w", err)
		}
		delete(t.segs, id)
		deleted = true
	}
	if deleted {
		// The same for a segment emptied by punching an older copy: its
		// punch was not synced, so its deletion must be durable before any
		// Remove is acknowledged, or a crash could bring the copy back.
		if err := syncDir(t.dir); err != nil {
			return fmt.Errorf("disk: sync directory %s: %w", t.dir, err)
		}
	}
	if sum.garbage > 0 || sum.truncated > 0 {
		t.log.Warn("repaired segments", "garbage_runs", sum.garbage, "truncated_bytes", sum.truncated)
	}
	t.rec.Duration = time.Since(start)
	t.log.Info("opened", "records", t.idx.live, "used", t.used, "segments", len(t.segs),
		"direct_io", t.direct, "skipped_bytes", sum.skipped, "evicted", evicted,
		"checkpoint", t.rec.Checkpoint, "from_checkpoint", t.rec.FromCheckpoint,
		"scanned", t.rec.Scanned, "took", t.rec.Duration)
	return nil
}

// rebuild indexes the segments ids, from cp where it vouches for them.
func (t *Tier) rebuild(ids []uint64, cp *checkpoint, sum *scanReport) error {
	w := newWorker(t.opts.BounceSize)
	segs := make([]*segment, 0, len(ids))
	for _, id := range ids {
		seg := &segment{id: id, path: filepath.Join(t.dir, segmentName(id)), fd: -1, ready: make(chan struct{})}
		close(seg.ready)
		fd, err := openFile(seg.path, openFlags(t.direct), 0)
		if err != nil {
			return fmt.Errorf("disk: open %s: %w", seg.path, err)
		}
		seg.fd = fd
		t.segs[id] = seg
		segs = append(segs, seg)
	}
	if cp == nil {
		for _, seg := range segs {
			t.rec.FullScans++
			rep, err := scan(seg, w, 0, func(h header) error {
				t.rec.Scanned++
				return t.recoverRecord(seg, found{key: h.key, off: h.off, size: h.size, up: h.parent()})
			})
			if err != nil {
				return fmt.Errorf("disk: scan %s: %w", seg.path, err)
			}
			t.scanned(seg, rep, sum)
		}
		return nil
	}
	return t.restoreAll(segs, cp, w, sum)
}

// found is a record a scan found.
type found struct {
	key       chunk.Key
	off, size int64
	up        parent // what its header names
}

// restoreAll indexes segs from the checkpoint cp and the log past it. The
// log (a few thousand header blocks, read one after another) is read on
// another goroutine while this one fills the index from the checkpoint
// and a third admits the restored keys to the policy (warm.go); the
// records found in the log are indexed last, in log order. Records the
// checkpoint lists were all stored before any record of the log past
// scan-from, so for those the policy takes them in log order as a full
// scan would. A segment whose plan failed (it does not match the
// checkpoint) is scanned whole, and its records, though older than the
// checkpointed records of later segments, enter the policy after all of
// them: under LRU and FIFO they go later than their age says. Only the
// order suffers, never the data, and only on the rare segment that fails
// its checks; admitting it in place would hold the restore of every later
// segment behind its scan.
func (t *Tier) restoreAll(segs []*segment, cp *checkpoint, w *worker, sum *scanReport) error {
	// Size the slots for what the checkpoint lists (the key table is
	// sized by its fill).
	t.idx.restoring = true
	defer func() { t.idx.restoring = false }()
	listed := cp.count()
	t.idx.slots = make([]slot, 1, listed+listed/8+1)
	rs := restorer{cp: cp, first: make(map[uint64][2]int, len(cp.segs)), w: w,
		kept: make([]int32, 0, listed)}
	n := 0
	for _, e := range cp.segs {
		rs.first[e.id] = [2]int{n, len(rs.first)}
		n += e.recs
	}
	plans := make([]segPlan, len(segs))
	for i, seg := range segs {
		p, err := rs.plan(seg)
		if err != nil {
			return fmt.Errorf("disk: restore %s from the checkpoint: %w", seg.path, err)
		}
		if _, inCkpt := rs.first[seg.id]; inCkpt && !p.ok {
			t.log.Warn("segment does not match the checkpoint: scanning it", "segment", seg.id)
		}
		plans[i] = p
	}
	t.idx.startWarm(cp, listed, len(segs))
	logs := t.readLogs(segs, plans)
	var err error
	for i, seg := range segs {
		if plans[i].ok {
			if err = t.restore(&rs, seg, plans[i], sum); err != nil {
				err = fmt.Errorf("disk: restore %s from the checkpoint: %w", seg.path, err)
				break
			}
		}
	}
	t.idx.endFeed()
	if err == nil && t.idx.keys.fill(t.idx.slots, 1) {
		err = fmt.Errorf("disk: %w: a key is listed twice", errCheckpoint)
	}
	if serr := <-logs.done; err == nil {
		err = serr
	}
	if err != nil {
		return err
	}
	if beforeLogTail != nil {
		beforeLogTail(t.idx)
	}
	for i, seg := range segs {
		if !plans[i].ok || plans[i].e.scanFrom == 0 {
			t.rec.FullScans++
		}
		for _, f := range logs.found[i] {
			t.rec.Scanned++
			if err := t.recoverRecord(seg, f); err != nil {
				return fmt.Errorf("disk: scan %s: %w", seg.path, err)
			}
		}
		t.scanned(seg, logs.reps[i], sum)
	}
	return nil
}

// beforeLogTail, when set (tests), is called by restoreAll before it
// indexes the records found in the log past the checkpoint.
var beforeLogTail func(x *index)

// logReads is what readLogs found, valid once done has delivered.
type logReads struct {
	found [][]found // by segment, in log order
	reps  []scanReport
	done  chan error
}

// readLogs scans, on a goroutine of its own, each segment from where its
// plan says the checkpoint stops vouching (from the start where it does
// not), collecting the records found; a scan also repairs what a scan
// repairs.
func (t *Tier) readLogs(segs []*segment, plans []segPlan) *logReads {
	r := &logReads{found: make([][]found, len(segs)), reps: make([]scanReport, len(segs)), done: make(chan error, 1)}
	go func() {
		w := newWorker(t.opts.BounceSize)
		for i, seg := range segs {
			var from int64
			if plans[i].ok {
				from = plans[i].e.scanFrom
			}
			rep, err := scan(seg, w, from, func(h header) error {
				r.found[i] = append(r.found[i], found{key: h.key, off: h.off, size: h.size, up: h.parent()})
				return nil
			})
			if err != nil {
				r.done <- fmt.Errorf("disk: scan %s: %w", seg.path, err)
				return
			}
			r.reps[i] = rep
		}
		r.done <- nil
	}()
	return r
}

// scanned notes what the scan of seg found.
func (t *Tier) scanned(seg *segment, rep scanReport, sum *scanReport) {
	seg.tail = rep.end // a checkpoint lists what lies below
	sum.records += rep.records
	sum.skipped += rep.skipped
	sum.garbage += rep.garbage
	sum.truncated += rep.truncated
	t.nextSeg = seg.id + 1
}

// resetIndex forgets what a failed rebuild indexed and closes its files.
func (t *Tier) resetIndex() error {
	order, err := policy.New[chunk.Key](t.opts.Policy)
	if err != nil {
		return err
	}
	t.idx.pol() // the policy goroutine is done with it
	for _, seg := range t.segs {
		unix.Close(seg.fd)
	}
	t.segs = make(map[uint64]*segment)
	t.idx = newIndex(order)
	t.used, t.rec = 0, Recovery{}
	return nil
}

// recoverRecord indexes a record found by a scan. A key found twice means
// the punch of the other copy was lost in a crash: the copy later in the
// log stays, as in a scan of every segment in order, and the other is
// punched. The key keeps its place in the policy, which orders keys, not
// copies: removing it there would make its children roots.
func (t *Tier) recoverRecord(seg *segment, f found) error {
	if i, ok := t.idx.get(f.key); ok {
		s := t.idx.slots[i]
		if s.seg > seg.id || (s.seg == seg.id && s.off > f.off) {
			// Only a checkpointed copy can lie later in the log.
			if err := punch(seg.fd, f.off, recordSize(f.size)); err != nil {
				return fmt.Errorf("punch %s at %d: %w", seg.path, f.off, err)
			}
			return nil
		}
		old := t.segs[s.seg]
		if err := punch(old.fd, s.off, recordSize(s.size)); err != nil {
			return fmt.Errorf("punch %s at %d: %w", old.path, s.off, err)
		}
		t.used -= recordSize(s.size)
		old.live--
		t.idx.move(i, seg.id, f.off, f.size, f.up)
		t.used += recordSize(f.size)
		seg.live++
		return nil
	}
	t.idx.noteRestored(f.key, f.up)
	i := t.idx.add(slot{key: f.key, seg: seg.id, off: f.off, size: f.size})
	t.idx.publishLive(i, f.up)
	t.used += recordSize(f.size)
	seg.live++
	return nil
}

// dropNow removes live slot i and punches its record synchronously; only
// for Open, before the I/O goroutines run.
func (t *Tier) dropNow(i int32) error {
	s := t.idx.slots[i]
	seg := t.segs[s.seg]
	n := recordSize(s.size)
	if err := punch(seg.fd, s.off, n); err != nil {
		return fmt.Errorf("punch %s at %d: %w", seg.path, s.off, err)
	}
	t.idx.drop(i)
	t.used -= n
	seg.live--
	return nil
}
