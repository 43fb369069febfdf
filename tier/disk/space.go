package disk

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"kvtier/internal/ratelog"
)

// What the tier does when its file system fills up.
//
// Options.Capacity is a budget, not a promise from the file system: the
// disk may be smaller than the budget, or shared with other files. A write
// that fails with ENOSPC asks the file system (statfs) who filled it:
//
//   - When the tier's own bytes are at least as many as everything else's,
//     the tier filled it: its budget was larger than the disk. It lowers
//     the capacity in force to what fits (its bytes plus the free ones,
//     less a margin) and evicts down to it, in the policy's order,
//     then retries the write once. It owns that space, so making room in
//     it is its own business.
//   - Otherwise the disk filled for other reasons, and evicting would only
//     hand our space to whoever is filling it. The tier turns read-only:
//     Puts fail at once with ErrReadOnly and do no I/O, while Gets,
//     Removes and evictions go on, so the records already there keep
//     serving.
//
// A read-only or shrunk tier looks at the file system again at most once
// per recheck interval, on a Put, and becomes writable (and grows back
// toward Options.Capacity) as soon as there is room. A tier opened on a
// file system too full for Open's probe writes starts read-only, and
// probes before its first write. Nothing is reported
// stored unless it was written: a Put that failed leaves no trace in the
// index, the counters or the observer.

// ErrReadOnly is returned by Puts while the file system is full for reasons
// other than the tier's own records.
var ErrReadOnly = errors.New("disk: read-only while the file system is full")

// recheckEvery is how often a read-only or shrunk tier asks the file system
// whether it has room again.
const recheckEvery = time.Second

// logEvery is the least time between two log lines about the same trouble.
const logEvery = 10 * time.Second

// Space is the disk tier's view of its room on the file system.
type Space struct {
	Capacity int64  // capacity in force: Options.Capacity, or less when the file system holds less
	ReadOnly bool   // Puts are refused until the file system has room
	NoSpace  uint64 // writes that failed because the file system was full
	Refused  uint64 // Puts refused while read-only
}

// Space returns the tier's room on its file system and its counters.
func (t *Tier) Space() Space {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.room
}

// fsRoom is what statfs says about a file system, in bytes, and how much
// of it the tier's directory takes.
type fsRoom struct {
	size  int64 // all blocks
	free  int64 // free blocks, including any reserved for root
	avail int64 // free blocks an unprivileged writer may use
	inode bool  // a new file can be created (or the file system has no inode limit)
	own   int64 // blocks the tier's files occupy
}

// others returns the bytes used by everything but the tier.
func (r fsRoom) others() int64 { return r.size - r.free - r.own }

func (r fsRoom) margin() int64 { return margin(r.size) }

// roomy reports whether a read-only tier may write again: twice the margin
// is free, so that one record does not fill the disk at once.
func (r fsRoom) roomy() bool { return r.avail >= 2*r.margin() && r.inode }

// statRoom looks at dir's file system. The tier's own share is measured
// from its files' allocated blocks, not from its accounting, which counts
// records being written (or failing to be) before their blocks exist.
func statRoom(dir string) (fsRoom, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fsRoom{}, fmt.Errorf("statfs %s: %w", dir, err)
	}
	bs := st.Frsize
	if bs <= 0 {
		bs = st.Bsize
	}
	own, err := dirBlocks(dir)
	if err != nil {
		return fsRoom{}, err
	}
	return fsRoom{
		size:  int64(st.Blocks) * bs,
		free:  int64(st.Bfree) * bs,
		avail: int64(st.Bavail) * bs,
		inode: st.Files == 0 || st.Ffree > 0,
		own:   own,
	}, nil
}

// dirBlocks returns the bytes allocated to the files in dir. A file that
// vanishes meanwhile (a segment being retired) counts as nothing.
func dirBlocks(dir string) (int64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("list %s: %w", dir, err)
	}
	var n int64
	for _, e := range entries {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, e.Name()), &st); err == nil {
			n += st.Blocks * 512 // st_blocks counts 512-byte units whatever the block size
		}
	}
	return n, nil
}

// margin is the room the tier leaves free on a file system of size bytes
// when it sizes itself to what fits: file system metadata grows with the
// files, and a disk filled to the last block serves no one well.
func margin(size int64) int64 {
	return min(max(size/64, 16*blockSize), 1<<30)
}

// isNoSpace reports whether err says the file system (or a quota) is full.
func isNoSpace(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}

// spaceLogs are the rate-limited log lines of running out of room.
type spaceLogs struct {
	shrunk   *ratelog.Limiter
	readOnly *ratelog.Limiter
	punch    *ratelog.Limiter
}

func newSpaceLogs(log *slog.Logger) spaceLogs {
	return spaceLogs{
		shrunk:   ratelog.New(log, slog.LevelWarn, "file system smaller than the disk tier's capacity: capacity lowered, evicting to fit", logEvery),
		readOnly: ratelog.New(log, slog.LevelWarn, "file system full: disk tier read-only until it has room", logEvery),
		punch:    ratelog.New(log, slog.LevelError, "freeing record space failed", logEvery),
	}
}

// noSpace handles a write of a need-byte record that failed because the
// file system is full (err). It either lowers the capacity in force, and
// says the write should be retried, or turns the tier read-only.
func (t *Tier) noSpace(need int64, err error) (retry bool) {
	room, serr := statRoom(t.dir)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.room.NoSpace++
	if serr == nil && !errors.Is(err, unix.EDQUOT) && room.inode {
		if room.own >= room.others() {
			// Each failure lowers the capacity by a margin at least, so
			// that a tier which filled the disk itself never waits for
			// room that only its own evictions could make.
			limit := min(room.own+room.avail, t.room.Capacity) - room.margin()
			if limit >= need {
				t.room.Capacity = limit
				t.st.Capacity = limit
				t.logs.shrunk.Log("capacity", limit, "configured", t.opts.Capacity, "err", err)
				return true
			}
		}
	}
	t.room.ReadOnly = true
	t.nextCheck = t.now() + int64(t.recheck)
	t.logs.readOnly.Log("own", room.own, "fs_size", room.size, "fs_avail", room.avail, "err", errors.Join(err, serr))
	return false
}

// admit lets a Put through unless the tier is read-only. A read-only or
// shrunk tier asks the file system for room again when the check is due,
// and a tier opened on a full one probes it first (reprobe).
func (t *Tier) admit() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if (t.room.ReadOnly || t.room.Capacity < t.opts.Capacity) && !t.checking && t.now() >= t.nextCheck {
		t.checking = true
		unprobed := t.unprobed
		t.mu.Unlock()
		room, err := statRoom(t.dir) // not under the lock: statfs can be slow
		probed := false
		if err == nil && unprobed && room.roomy() {
			err = t.reprobe()
			probed = err == nil
		}
		t.mu.Lock()
		t.checking = false
		t.nextCheck = t.now() + int64(t.recheck)
		if probed {
			t.unprobed = false
		}
		if err == nil && !t.unprobed {
			t.regainLocked(room)
		}
	}
	if t.room.ReadOnly {
		t.room.Refused++
		return ErrReadOnly
	}
	return nil
}

// regainLocked makes the tier writable again, and grows its capacity back
// toward the configured one, as far as the file system's room allows.
func (t *Tier) regainLocked(room fsRoom) {
	m := room.margin()
	if t.room.ReadOnly {
		if !room.roomy() {
			return
		}
		t.room.ReadOnly = false
		t.log.Info("file system has room again: disk tier writable", "fs_avail", room.avail)
	}
	if fits := room.own + room.avail - m; fits > t.room.Capacity {
		t.room.Capacity = min(fits, t.opts.Capacity)
		t.st.Capacity = t.room.Capacity
	}
}

// headroomLocked is the free space Puts keep ahead of need: Options.Headroom,
// scaled down with the capacity when the file system forced it lower.
func (t *Tier) headroomLocked() int64 {
	if t.room.Capacity < t.opts.Capacity {
		return min(t.opts.Headroom, t.room.Capacity/64)
	}
	return t.opts.Headroom
}

// probeFull settles direct I/O on a file system too full for probe's test
// writes. It only opens a scratch file with O_DIRECT, which file systems
// without it refuse (EINVAL); whether writes take O_DIRECT and holes can be
// punched is left to reprobe, which runs before the tier writes anything.
func probeFull(dir string, mode DirectMode) (bool, error) {
	if mode == DirectOff {
		return false, nil
	}
	path := filepath.Join(dir, ".probe")
	defer os.Remove(path)
	fd, err := openFile(path, openFlags(true)|unix.O_CREAT|unix.O_TRUNC, 0o644)
	switch {
	case err == nil:
		unix.Close(fd)
		return true, nil
	case mode == DirectAuto && errors.Is(err, unix.EINVAL):
		return false, nil
	}
	return false, fmt.Errorf("disk: O_DIRECT in %s: %w", dir, err)
}

// reprobe runs the full probe of a tier opened on a full file system, once
// there is room for it. The tier stays read-only if the probe fails, or
// finds direct I/O other than what the open segment files use.
func (t *Tier) reprobe() error {
	direct, err := probe(t.dir, t.opts.DirectIO)
	if err == nil && direct != t.direct {
		err = fmt.Errorf("disk: %s takes O_DIRECT writes: %v, but the tier opened with direct I/O %v: reopen it", t.dir, direct, t.direct)
	}
	if err != nil {
		t.logs.readOnly.Log("probe", err)
	}
	return err
}
