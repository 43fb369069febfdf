package disk

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"

	"kvtier/chunk"
)

// Space comes back one record at a time: a record leaves the index at once
// (evicted, removed or found corrupt), and its byte range is punched out of
// the segment file by an I/O goroutine at delete priority. Its bytes count
// as used until the punch is done, so the files never outgrow the capacity.
// A segment whose records are all gone, and that is neither being appended
// to nor read, is closed and deleted.

// keepHeadroomLocked evicts until Headroom bytes are free or being freed,
// so that the next Put need not wait for punches. Not while the policy
// takes in what Open restored: its caller cannot let go of the lock to
// wait for it (warm.go), and a restarted tier sits just under its
// headroom, so the first Put after Open would wait.
func (t *Tier) keepHeadroomLocked() {
	if !t.idx.policyReady() {
		return
	}
	for t.room.Capacity-(t.used-t.punching) < t.headroomLocked() {
		if !t.evictOneLocked() {
			return
		}
	}
}

// evictOneLocked evicts the policy's next unpinned victim.
func (t *Tier) evictOneLocked() bool {
	i := t.idx.victim(t.now())
	if i < 0 {
		return false
	}
	t.st.Evictions++
	t.dropLocked(i)
	return true
}

// dropLocked takes live slot i out of the index and queues the punch that
// frees its bytes.
func (t *Tier) dropLocked(i int32) {
	s := t.idx.slots[i]
	t.idx.drop(i)
	t.ckptDirty = true
	if o := t.observer(); o != nil {
		o.Dropped(t.Name(), s.key)
	}
	t.punchLocked(t.segs[s.seg], s.off, recordSize(s.size), s.key)
}

// punchLocked queues freeing n bytes at off in seg, which hold a copy of
// key. The bytes stay counted as used until the punch is done, so the files
// never outgrow the capacity, and the copy stays counted as a ghost of key
// until the punch is durable, so that a Remove can wait for it.
func (t *Tier) punchLocked(seg *segment, off, n int64, key chunk.Key) {
	t.punching += n
	t.ghosts[key]++
	o := t.getOp()
	o.kind, o.seg, o.off, o.length, o.key, o.async = opPunch, seg, off, n, key, true
	t.sched.submit(o)
}

// retireIfEmptyLocked queues deleting seg once nothing can touch it again.
func (t *Tier) retireIfEmptyLocked(seg *segment) {
	if seg == t.active || seg.live > 0 || seg.refs > 0 || seg.retiring {
		return
	}
	seg.retiring = true
	o := t.getOp()
	o.kind, o.seg, o.async = opRetire, seg, true
	t.sched.submit(o)
}

// execPunch frees a record's bytes and fsyncs, so that an evicted copy can
// never outlive a later Remove of its key across a crash.
func (t *Tier) execPunch(o *op) {
	seg := o.seg
	err := punch(seg.fd, o.off, o.length)
	if err == nil {
		err = unix.Fsync(seg.fd)
	}
	if err != nil {
		t.logs.punch.Log("segment", seg.id, "offset", o.off, "err", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.punching -= o.length
	if err != nil {
		seg.leaked += o.length
	} else {
		t.used -= o.length
	}
	if t.ghosts[o.key]--; t.ghosts[o.key] <= 0 {
		delete(t.ghosts, o.key)
	}
	seg.live--
	t.retireIfEmptyLocked(seg)
	t.space.Broadcast()
}

func (t *Tier) execRetire(seg *segment) {
	if seg.fd >= 0 {
		unix.Close(seg.fd)
	}
	if err := os.Remove(seg.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.log.Error("deleting empty segment failed", "segment", seg.id, "err", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	seg.fd = -1
	t.used -= seg.leaked
	delete(t.segs, seg.id)
	t.space.Broadcast()
}
