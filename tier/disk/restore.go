package disk

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"kvtier/chunk"
)

// Recovery describes how Open rebuilt the index.
type Recovery struct {
	Checkpoint     bool          // a valid checkpoint was found and used
	FromCheckpoint int           // records taken from the checkpoint without reading them
	Scanned        int           // records found by reading their header blocks
	FullScans      int           // segments read from their first block: new since the checkpoint, or not matching it
	Duration       time.Duration // time Open spent rebuilding the index
}

// Recovered reports how Open rebuilt the index.
func (t *Tier) Recovered() Recovery { return t.rec }

// takeCheckpoint reads, validates and then durably deletes the directory's
// checkpoint, before recovery changes any segment file. It returns nil when
// there is none, when it is invalid (logged: Open then scans everything) or
// when punched ranges may not read as holes on this file system.
func (t *Tier) takeCheckpoint() (*checkpoint, error) {
	path := filepath.Join(t.dir, checkpointName)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		os.Remove(path + ".tmp")
		return nil, nil
	}
	var cp *checkpoint
	if err == nil {
		cp, err = decodeCheckpoint(b)
	}
	if err == nil && !holesExact(t.dir) {
		cp, err = nil, errors.New("the file system's blocks are larger than 4096 bytes")
	}
	if err != nil {
		t.log.Warn("checkpoint not used: scanning every segment", "err", err)
	}
	for _, p := range []string{path, path + ".tmp"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("disk: delete %s: %w", p, err)
		}
	}
	if err := syncDir(t.dir); err != nil {
		return nil, fmt.Errorf("disk: sync directory %s: %w", t.dir, err)
	}
	return cp, nil
}

// holesExact reports whether punching a 4096-aligned range of dir's file
// system frees exactly its blocks, so that it reads as a hole.
func holesExact(dir string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false
	}
	return st.Bsize > 0 && st.Bsize <= blockSize && blockSize%st.Bsize == 0
}

// restorer carries a checkpoint and scratch space through recovery.
type restorer struct {
	cp    *checkpoint
	first map[uint64][2]int // segment number: first record entry, segment entry
	w     *worker
	exts  [][2]int64 // data extents of the segment at hand
	kept  []int      // record entries whose bytes are all there
	keys  []chunk.Key
}

// restore indexes the checkpointed records of seg that are still on disk,
// punches what else lies below the checkpoint's scan-from offset, and
// returns the offset the scan must go on from: 0 when the checkpoint does
// not cover seg or seg does not match it.
func (t *Tier) restore(rs *restorer, seg *segment, sum *scanReport) (int64, error) {
	if rs.cp == nil {
		return 0, nil
	}
	at, ok := rs.first[seg.id]
	if !ok {
		return 0, nil
	}
	e := rs.cp.segs[at[1]]
	if ok, err := rs.check(seg, e, at[0]); err != nil || !ok {
		if err == nil {
			t.log.Warn("segment does not match the checkpoint: scanning it", "segment", seg.id)
		}
		return 0, err
	}
	// Below scan-from, whatever no kept record covers is a copy whose
	// punch was cut short, or garbage: free it, as a scan would.
	var prevEnd int64
	x := 0
	gap := func(lo, hi int64) error {
		for x < len(rs.exts) && rs.exts[x][1] <= lo {
			x++
		}
		if lo >= hi || x == len(rs.exts) || rs.exts[x][0] >= hi {
			return nil
		}
		sum.skipped += hi - lo
		return punch(seg.fd, lo, hi-lo)
	}
	// The policy admits the kept records, in log order, on another
	// goroutine while this one fills the index's map: the two maps cost
	// about the same, and a million records take a second on one core.
	rs.keys = rs.keys[:0]
	for _, i := range rs.kept {
		key, _, _ := rs.cp.rec(i)
		rs.keys = append(rs.keys, key)
	}
	admitted := make(chan struct{})
	go func() {
		defer close(admitted)
		for _, k := range rs.keys {
			t.idx.order.Admit(k)
		}
	}()
	var err error
	dup := false
	for _, i := range rs.kept {
		key, off, size := rs.cp.rec(i)
		if err = gap(prevEnd, off); err != nil {
			break
		}
		n := len(t.idx.byKey)
		t.idx.byKey[key] = int32(len(t.idx.slots))
		t.idx.slots = append(t.idx.slots, slot{key: key, seg: seg.id, off: off, size: size, state: slotLive})
		dup = dup || len(t.idx.byKey) == n // a correct checkpoint lists a key once
		t.used += recordSize(size)
		seg.live++
		prevEnd = off + recordSize(size)
	}
	<-admitted
	t.idx.live += len(rs.kept)
	t.rec.FromCheckpoint += len(rs.kept)
	switch {
	case err != nil:
		return 0, err
	case dup:
		return 0, fmt.Errorf("%w: a key is listed twice", errCheckpoint)
	}
	if err := gap(prevEnd, e.scanFrom); err != nil {
		return 0, err
	}
	return e.scanFrom, nil
}

// check finds out, without changing anything, whether seg is the file the
// checkpoint entry e describes, and which of its records are still whole
// (rs.kept). It reads the header blocks of the first and last of them.
func (rs *restorer) check(seg *segment, e ckptSeg, first int) (bool, error) {
	var st unix.Stat_t
	if err := unix.Fstat(seg.fd, &st); err != nil {
		return false, err
	}
	if st.Ino != e.ino || st.Size < e.scanFrom {
		return false, nil
	}
	if err := rs.extents(seg.fd, e.scanFrom); err != nil {
		return false, err
	}
	rs.kept = rs.kept[:0]
	x := 0
	for i := first; i < first+e.recs; i++ {
		_, off, size := rs.cp.rec(i)
		end := off + recordSize(size)
		for x < len(rs.exts) && rs.exts[x][1] <= off {
			x++
		}
		if x < len(rs.exts) && rs.exts[x][0] <= off && end <= rs.exts[x][1] {
			rs.kept = append(rs.kept, i)
		}
	}
	if len(rs.kept) == 0 {
		return true, nil
	}
	for _, i := range []int{rs.kept[0], rs.kept[len(rs.kept)-1]} {
		key, off, size := rs.cp.rec(i)
		h, err := readHeaderAt(seg, rs.w, off)
		if err != nil {
			return false, err
		}
		if h == nil || h.key != key || h.size != size {
			return false, nil
		}
	}
	return true, nil
}

// extents lists the data extents of fd below limit into rs.exts.
func (rs *restorer) extents(fd int, limit int64) error {
	rs.exts = rs.exts[:0]
	for pos := int64(0); pos < limit; {
		lo, err := unix.Seek(fd, pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) || (err == nil && lo >= limit) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("seek data from %d: %w", pos, err)
		}
		hi, err := unix.Seek(fd, lo, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole from %d: %w", lo, err)
		}
		rs.exts = append(rs.exts, [2]int64{lo, min(hi, limit)})
		pos = hi
	}
	return nil
}
