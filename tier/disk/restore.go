package disk

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
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
	exts  [][2]int64 // data extents below scan-from of every planned segment
	kept  []int32    // record entries whose bytes are all there, every segment; handed to the policy by segment
}

// segPlan is what the checkpoint vouches for in one segment file.
type segPlan struct {
	ok         bool // the checkpoint lists the file and it matches
	e          ckptSeg
	exts, kept [2]int // ranges of restorer.exts and restorer.kept
}

// plan finds out, without changing anything, whether the checkpoint lists
// seg and seg is still the file it describes, and which listed records are
// still whole. It reads the header blocks of the first and last of them.
func (rs *restorer) plan(seg *segment) (segPlan, error) {
	at, ok := rs.first[seg.id]
	if !ok {
		return segPlan{}, nil
	}
	p := segPlan{e: rs.cp.segs[at[1]]}
	var st unix.Stat_t
	if err := unix.Fstat(seg.fd, &st); err != nil {
		return p, err
	}
	if st.Ino != p.e.ino || st.Size < p.e.scanFrom {
		return p, nil
	}
	p.exts[0] = len(rs.exts)
	if err := rs.extents(seg.fd, p.e.scanFrom); err != nil {
		return p, err
	}
	p.exts[1] = len(rs.exts)
	exts := rs.exts[p.exts[0]:p.exts[1]]
	p.kept[0] = len(rs.kept)
	x := 0
	for i := at[0]; i < at[0]+p.e.recs; i++ {
		_, off, size := rs.cp.rec(i)
		end := off + recordSize(size)
		for x < len(exts) && exts[x][1] <= off {
			x++
		}
		if x < len(exts) && exts[x][0] <= off && end <= exts[x][1] {
			rs.kept = append(rs.kept, int32(i))
		}
	}
	p.kept[1] = len(rs.kept)
	kept := rs.kept[p.kept[0]:p.kept[1]]
	if len(kept) > 0 {
		for _, i := range []int32{kept[0], kept[len(kept)-1]} {
			key, off, size := rs.cp.rec(int(i))
			h, err := readHeaderAt(seg, rs.w, off)
			if err != nil {
				return p, err
			}
			if h == nil || h.key != key || h.size != size {
				rs.kept = rs.kept[:p.kept[0]]
				return p, nil
			}
		}
	}
	p.ok = true
	return p, nil
}

// restore adds the records of seg that p keeps to the index's slots (the
// caller then maps their keys), hands their entries to the policy
// goroutine (which decodes the keys and parents from the checkpoint) and punches what else lies below the checkpoint's
// scan-from offset: a copy whose punch a crash cut short, or garbage, as a
// scan would.
func (t *Tier) restore(rs *restorer, seg *segment, p segPlan, sum *scanReport) error {
	exts := rs.exts[p.exts[0]:p.exts[1]]
	var prevEnd int64
	x := 0
	gap := func(lo, hi int64) error {
		for x < len(exts) && exts[x][1] <= lo {
			x++
		}
		if lo >= hi || x == len(exts) || exts[x][0] >= hi {
			return nil
		}
		sum.skipped += hi - lo
		return punch(seg.fd, lo, hi-lo)
	}
	kept := rs.kept[p.kept[0]:p.kept[1]]
	for _, i := range kept {
		key, off, size := rs.cp.rec(int(i))
		if err := gap(prevEnd, off); err != nil {
			return err
		}
		up, hasUp := rs.cp.parent(int(i))
		t.idx.slots = append(t.idx.slots, slot{key: key, seg: seg.id, off: off, size: size, up: up, hasUp: hasUp, state: slotLive})
		t.used += recordSize(size)
		seg.live++
		prevEnd = off + recordSize(size)
	}
	t.idx.feedWarm(kept)
	t.idx.live += len(kept)
	t.rec.FromCheckpoint += len(kept)
	return gap(prevEnd, p.e.scanFrom)
}

// extents appends the data extents of fd below limit to rs.exts.
func (rs *restorer) extents(fd int, limit int64) error {
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
