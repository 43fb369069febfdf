package disk

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// segment is one append-only segment file. The fields from tail on are
// guarded by the tier's mutex.
type segment struct {
	id    uint64
	path  string
	fd    int           // valid once ready is closed and openErr is nil
	ready chan struct{} // closed when the file has been created (or failed to be)
	// openErr is set before ready is closed.
	openErr error
	sync    syncer

	tail     int64 // next append offset
	live     int   // records reserved, live or waiting for their punch
	refs     int   // reads in flight
	leaked   int64 // bytes a failed punch could not free; freed with the file
	failed   bool  // an fdatasync failed: take no more records
	retiring bool  // close-and-delete is queued
}

func segmentName(id uint64) string { return fmt.Sprintf("%016x.seg", id) }

// parseSegmentName returns the number of a segment file name.
func parseSegmentName(name string) (uint64, bool) {
	hex, ok := strings.CutSuffix(name, ".seg")
	if !ok || len(hex) != 16 {
		return 0, false
	}
	id, err := strconv.ParseUint(hex, 16, 64)
	return id, err == nil
}

// openFile is unix.Open; tests replace it to play a file system that refuses
// O_DIRECT.
var openFile = func(path string, flags int, perm uint32) (int, error) {
	return unix.Open(path, flags|unix.O_CLOEXEC, perm)
}

func openFlags(direct bool) int {
	if direct {
		return unix.O_RDWR | unix.O_DIRECT
	}
	return unix.O_RDWR
}

// syncer makes a segment's completed writes durable with group commit: a
// caller whose write finished while another caller's fdatasync was already
// running waits for it to end and then starts one fdatasync for everyone
// that queued up meanwhile. An fdatasync error sticks: after a failed flush
// the kernel may have dropped dirty pages, so later flushes prove nothing.
type syncer struct {
	mu      sync.Mutex
	cond    sync.Cond
	issued  uint64 // tickets handed out
	durable uint64 // highest ticket known durable
	running bool
	err     error
	flush   func(fd int) error // unix.Fdatasync unless a test says otherwise
}

// sync returns once every write that completed before the call is durable.
func (s *syncer) sync(fd int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cond.L == nil {
		s.cond.L = &s.mu
	}
	s.issued++
	ticket := s.issued
	for s.running && s.durable < ticket && s.err == nil {
		s.cond.Wait()
	}
	if s.err != nil || s.durable >= ticket {
		return s.err
	}
	s.running = true
	target := s.issued
	flush := s.flush
	if flush == nil {
		flush = unix.Fdatasync
	}
	s.mu.Unlock()
	err := flush(fd)
	s.mu.Lock()
	s.running = false
	if err != nil {
		s.err = fmt.Errorf("fdatasync: %w", err)
	} else {
		s.durable = target
	}
	s.cond.Broadcast()
	return s.err
}

// failed reports whether an fdatasync has failed.
func (s *syncer) failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err != nil
}

// lockDir takes the directory's LOCK file exclusively, so a second process
// (or a second Open in this one) cannot interleave segment writes with ours.
func lockDir(dir string) (int, error) {
	path := filepath.Join(dir, "LOCK")
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return -1, fmt.Errorf("disk: open %s: %w", path, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return -1, fmt.Errorf("disk: %s is in use by another tier", dir)
		}
		return -1, fmt.Errorf("disk: lock %s: %w", path, err)
	}
	return fd, nil
}

// probe finds out whether dir's file system takes O_DIRECT (under mode) and
// can punch holes, by trying both on a scratch file.
func probe(dir string, mode DirectMode) (direct bool, err error) {
	path := filepath.Join(dir, ".probe")
	defer os.Remove(path)
	var fd int
	if mode != DirectOff {
		fd, err = probeWrite(path, true)
		switch {
		case err == nil:
			direct = true
		case mode == DirectOn || !errors.Is(err, unix.EINVAL):
			return false, fmt.Errorf("disk: O_DIRECT in %s: %w", dir, err)
		}
	}
	if !direct {
		if fd, err = probeWrite(path, false); err != nil {
			return false, fmt.Errorf("disk: write in %s: %w", dir, err)
		}
	}
	defer unix.Close(fd)
	if err := punch(fd, 0, blockSize); err != nil {
		return false, fmt.Errorf("disk: %s cannot punch holes, which the disk tier needs to free space: %w", dir, err)
	}
	return direct, nil
}

// probeWrite creates path and writes two aligned blocks to it.
func probeWrite(path string, direct bool) (int, error) {
	fd, err := openFile(path, openFlags(direct)|unix.O_CREAT|unix.O_TRUNC, 0o644)
	if err != nil {
		return -1, err
	}
	if _, err := unix.Pwrite(fd, alignedBuf(2*blockSize), 0); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func punch(fd int, off, n int64) error {
	return unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
}

// listSegments returns the segment numbers in dir, ascending.
func listSegments(dir string) ([]uint64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("disk: list %s: %w", dir, err)
	}
	var ids []uint64
	for _, e := range entries {
		if id, ok := parseSegmentName(e.Name()); ok && e.Type().IsRegular() {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids, nil
}

func syncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return err
	}
	if dirSynced != nil {
		dirSynced(dir)
	}
	return nil
}

// dirSynced, when set (tests), is called after each directory sync.
var dirSynced func(dir string)

// scanReport counts what a segment scan found.
type scanReport struct {
	records   int
	skipped   int64 // bytes of holes and garbage between records, punched
	garbage   int   // runs of invalid non-zero blocks
	truncated int64 // bytes cut off the end
	end       int64 // the segment's length after the scan
}

// scan walks segment seg's records in file order from offset from (a block
// boundary where a record starts, or the end of the segment's last
// checkpointed record) and calls found for each one whose header is intact
// and whose bytes all lie inside the file.
// Payloads are not read: Get verifies them. Whatever lies between records
// (holes, torn or corrupted blocks) is punched out, and a torn tail is
// truncated. w provides aligned scratch space.
func scan(seg *segment, w *worker, from int64, found func(header) error) (scanReport, error) {
	var rep scanReport
	var st unix.Stat_t
	if err := unix.Fstat(seg.fd, &st); err != nil {
		return rep, fmt.Errorf("stat: %w", err)
	}
	size := st.Size
	off, end := from, from // end: just past the last valid record
	var ra readAhead
	for off+blockSize <= size {
		h, err := ra.header(seg, w, off, size)
		if err != nil {
			return rep, err
		}
		if h != nil {
			if next := off + recordSize(h.size); next <= size {
				end = next
				if err := found(*h); err != nil {
					return rep, err
				}
				rep.records++
				off = next
				ra.wide = recordSize(h.size) <= int64(len(w.bounce))/readAheadRecords
				continue
			}
			break // the payload runs past the end: a torn last write
		}
		ra.lo, ra.hi = 0, 0 // resync reads through w.bounce
		var next int64
		if isZero(w.hdr) {
			next, err = seekData(seg.fd, off+blockSize, size)
		} else {
			rep.garbage++
			next, err = resync(seg, w, off+blockSize, size)
		}
		if err != nil {
			return rep, err
		}
		if next < 0 {
			break
		}
		if err := punch(seg.fd, off, next-off); err != nil {
			return rep, fmt.Errorf("punch: %w", err)
		}
		rep.skipped += next - off
		off = next
	}
	if end < size {
		if err := unix.Ftruncate(seg.fd, end); err != nil {
			return rep, fmt.Errorf("truncate: %w", err)
		}
		rep.truncated = size - end
	}
	rep.end = end
	return rep, nil
}

// readAheadRecords is how many records of the last one's size must fit in
// a worker's bounce buffer for a scan to read ahead.
const readAheadRecords = 8

// readAhead lets a scan read the header blocks of small records a bounce
// buffer at a time. Each header says where the next one is, so a scan is a
// chain of dependent reads: with one read per header, the few thousand
// records written after a checkpoint cost a few thousand device round
// trips. Where the last record was small, the scan reads the next
// len(w.bounce) bytes at once and finds the following headers in them;
// large records are read header block by header block, as before.
type readAhead struct {
	wide   bool
	lo, hi int64 // the file range w.bounce holds; empty when lo == hi
}

// header reads the block at off into w.hdr, from the window when it holds
// it, and returns its header as readHeaderAt does.
func (ra *readAhead) header(seg *segment, w *worker, off, size int64) (*header, error) {
	if off < ra.lo || off+blockSize > ra.hi {
		if !ra.wide {
			return readHeaderAt(seg, w, off)
		}
		if err := ra.fill(seg.fd, w.bounce, off, size); err != nil {
			return nil, fmt.Errorf("read headers at %d: %w", off, err)
		}
	}
	copy(w.hdr, w.bounce[off-ra.lo:off-ra.lo+blockSize])
	return headerAt(seg, w.hdr, off)
}

// fill reads buf's length, or what is left of the file, from off.
func (ra *readAhead) fill(fd int, buf []byte, off, size int64) error {
	buf = buf[:min(int64(len(buf)), alignUp(size-off))]
	for {
		n, err := unix.Pread(fd, buf, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n < blockSize {
			return io.ErrUnexpectedEOF
		}
		ra.lo, ra.hi = off, off+int64(n)&^(blockSize-1)
		return nil
	}
}

// headerAt returns the header in block if it is a valid header for exactly
// this place, else nil.
func headerAt(seg *segment, block []byte, off int64) (*header, error) {
	h, err := decodeHeader(block)
	if err != nil || h.seg != seg.id || h.off != off {
		return nil, nil
	}
	return &h, nil
}

// readHeaderAt reads the block at off into w.hdr and returns its header if
// it is a valid header for exactly this place, else nil.
func readHeaderAt(seg *segment, w *worker, off int64) (*header, error) {
	if err := preadFull(seg.fd, w.hdr, off); err != nil {
		return nil, fmt.Errorf("read header at %d: %w", off, err)
	}
	return headerAt(seg, w.hdr, off)
}

// seekData returns the first block boundary at or after from that holds
// data, or -1 if there is none before size.
func seekData(fd int, from, size int64) (int64, error) {
	if from >= size {
		return -1, nil
	}
	next, err := unix.Seek(fd, from, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) {
		return -1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("seek data from %d: %w", from, err)
	}
	next = max(from, next&^(blockSize-1))
	if next >= size {
		return -1, nil
	}
	return next, nil
}

// resync looks block by block, from from on, for the next valid header,
// reading through w.bounce. It returns -1 if there is none.
func resync(seg *segment, w *worker, from, size int64) (int64, error) {
	for from < size {
		n := min(int64(len(w.bounce)), alignUp(size-from))
		got, err := unix.Pread(seg.fd, w.bounce[:n], from)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("read at %d: %w", from, err)
		}
		for b := 0; b+blockSize <= got; b += blockSize {
			h, err := decodeHeader(w.bounce[b : b+blockSize])
			if err == nil && h.seg == seg.id && h.off == from+int64(b) {
				return h.off, nil
			}
		}
		if got < blockSize {
			return -1, nil
		}
		from += int64(got) &^ (blockSize - 1)
	}
	return -1, nil
}
