package disk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"

	"kvtier/chunk"
	"kvtier/tier"
)

// CHECKPOINT FORMAT
//
// A checkpoint is a copy of the index written to the file CHECKPOINT in the
// tier directory, so that Open can rebuild the index without reading one
// header block per record. It is written to CHECKPOINT.tmp, fsync'ed,
// renamed over CHECKPOINT and the directory fsync'ed, so the name always
// holds a whole checkpoint or none. All integers are little-endian:
//
//	header, 32 bytes:
//	     0  4 magic "KVTC"
//	     4  2 checkpoint format version (2; 1 is read too)
//	     6  2 reserved, zero
//	     8  8 the segment number the next new segment gets
//	    16  8 number of segment entries S
//	    24  8 number of record entries N
//	S segment entries, 32 bytes each, segment numbers strictly ascending:
//	     0  8 segment number
//	     8  8 inode number of the segment file
//	    16  8 scan-from offset: records at or past it are not listed
//	    24  8 number of record entries for this segment
//	N record entries, 56 bytes each, grouped by segment in the order of the
//	segment entries, offsets strictly ascending within a segment:
//	     0  8 key scope
//	     8 16 key hash
//	    24  8 offset of the record's header block in the segment
//	    32  8 payload length; bit 63 set when the record names its parent
//	    40 16 the parent's key hash (its scope is the key's), zero when none
//	trailer, 8 bytes: xxh3-64 of every byte before it
//
// Version 1, written before parents were kept, has 40-byte record entries
// (the first 40 bytes above, bit 63 clear): its records come back as roots
// of their prefix chains, as they did.
//
// A checkpoint lists the records that were live when it was taken and lay
// below their segment's scan-from offset: the end of the segment's reserved
// space, or the offset of its earliest record still being written. After the
// checkpoint the tier only ever appends past those offsets, in new
// segments, punches records out and deletes empty segments, so Open trusts
// the checkpoint as follows (recover.go):
//
//   - a segment file that the checkpoint does not list, or whose inode
//     differs, or that is shorter than its scan-from offset, is scanned in
//     full, as without a checkpoint;
//   - a listed record is kept only if its whole byte range is still data
//     (lseek SEEK_DATA/SEEK_HOLE), since a removed or evicted record is a
//     hole; data below scan-from that no kept record covers (a copy whose
//     punch a crash interrupted) is punched;
//   - the header blocks of the first and last kept record of each segment
//     are read and must match their entries, or the segment is scanned in
//     full;
//   - the segment is scanned from its scan-from offset on as in a full scan.
//
// Punched ranges must read as holes for the second rule, which holds where
// the file system's block size divides 4096; elsewhere the checkpoint is
// not used. Open deletes the checkpoint (durably) before it changes any
// segment file, so a checkpoint never describes files that a later Open
// truncated or re-created; an Open that cannot read or validate it scans
// every segment. Every Get still verifies the header and payload it reads,
// so whatever a checkpoint claims, no wrong byte is ever returned.

const (
	checkpointName = "CHECKPOINT"
	ckptVersion    = 2
	ckptHeaderLen  = 32
	ckptSegLen     = 32
	ckptRecLen     = 56 // a version 2 record entry
	ckptRecLenV1   = 40
	ckptTrailerLen = 8
	ckptHasUp      = 1 << 63 // in a record entry's payload length
)

var ckptMagic = [4]byte{'K', 'V', 'T', 'C'}

// errCheckpoint wraps every reason a checkpoint file is rejected.
var errCheckpoint = errors.New("invalid checkpoint")

// ckptSeg is one segment entry.
type ckptSeg struct {
	id       uint64
	ino      uint64
	scanFrom int64
	recs     int // record entries for this segment
}

// checkpoint is a decoded, structurally valid checkpoint. Records stay in
// their encoded form until recovery walks them.
type checkpoint struct {
	nextSeg uint64
	segs    []ckptSeg
	recs    []byte // N*recLen bytes
	recLen  int    // bytes per record entry: ckptRecLen, or ckptRecLenV1
}

// count is the number of record entries.
func (c *checkpoint) count() int { return len(c.recs) / c.recLen }

// rec decodes record entry i.
func (c *checkpoint) rec(i int) (chunk.Key, int64, int64) {
	b := c.recs[i*c.recLen : (i+1)*c.recLen]
	var k chunk.Key
	k.Scope = binary.LittleEndian.Uint64(b)
	copy(k.Hash[:], b[8:24])
	return k, int64(binary.LittleEndian.Uint64(b[24:])), int64(binary.LittleEndian.Uint64(b[32:]) &^ ckptHasUp)
}

// parent returns the parent hash record entry i names, if any.
func (c *checkpoint) parent(i int) (chunk.Hash, bool) {
	var h chunk.Hash
	b := c.recs[i*c.recLen : (i+1)*c.recLen]
	if c.recLen == ckptRecLenV1 || binary.LittleEndian.Uint64(b[32:])&ckptHasUp == 0 {
		return h, false
	}
	copy(h[:], b[40:56])
	return h, true
}

// decodeCheckpoint parses and validates a checkpoint file's bytes: length,
// checksum, the order of segments and records, that records do not overlap
// and lie below their segment's scan-from offset. It never panics.
func decodeCheckpoint(b []byte) (*checkpoint, error) {
	bad := func(why string) (*checkpoint, error) { return nil, fmt.Errorf("%w: %s", errCheckpoint, why) }
	if len(b) < ckptHeaderLen+ckptTrailerLen {
		return bad("too short")
	}
	if !bytes.Equal(b[:4], ckptMagic[:]) {
		return bad("magic mismatch")
	}
	recLen := ckptRecLen
	switch v := binary.LittleEndian.Uint16(b[4:]); v {
	case ckptVersion:
	case 1:
		recLen = ckptRecLenV1
	default:
		return bad(fmt.Sprintf("unsupported version %d", v))
	}
	if binary.LittleEndian.Uint16(b[6:]) != 0 {
		return bad("reserved field set")
	}
	body := uint64(len(b) - ckptHeaderLen - ckptTrailerLen)
	nseg, nrec := binary.LittleEndian.Uint64(b[16:]), binary.LittleEndian.Uint64(b[24:])
	if nseg > body/ckptSegLen || nrec > body/uint64(recLen) || nseg*ckptSegLen+nrec*uint64(recLen) != body {
		return bad("length does not match the entry counts")
	}
	end := len(b) - ckptTrailerLen
	if binary.LittleEndian.Uint64(b[end:]) != xxh3.Hash(b[:end]) {
		return bad("checksum mismatch")
	}
	c := &checkpoint{nextSeg: binary.LittleEndian.Uint64(b[8:]), segs: make([]ckptSeg, nseg), recLen: recLen}
	segBytes := b[ckptHeaderLen : ckptHeaderLen+int(nseg)*ckptSegLen]
	c.recs = b[ckptHeaderLen+len(segBytes) : end]
	first := 0 // first record entry of the segment at hand
	for i := range c.segs {
		e := segBytes[i*ckptSegLen:]
		s := ckptSeg{
			id:       binary.LittleEndian.Uint64(e),
			ino:      binary.LittleEndian.Uint64(e[8:]),
			scanFrom: int64(binary.LittleEndian.Uint64(e[16:])),
		}
		n := binary.LittleEndian.Uint64(e[24:])
		switch {
		case s.id >= c.nextSeg || (i > 0 && s.id <= c.segs[i-1].id):
			return bad("segment numbers out of order")
		case s.scanFrom < 0 || s.scanFrom > maxPayload || s.scanFrom%blockSize != 0:
			return bad("scan-from offset out of range")
		case n > nrec-uint64(first):
			return bad("segment record counts exceed the total")
		}
		s.recs = int(n)
		if err := checkRecs(c, first, s); err != nil {
			return nil, err
		}
		c.segs[i] = s
		first += s.recs
	}
	if first != int(nrec) {
		return bad("segment record counts do not add up to the total")
	}
	return c, nil
}

// checkRecs checks the record entries of segment s, which start at entry
// first: aligned, ascending, disjoint and below scan-from.
func checkRecs(c *checkpoint, first int, s ckptSeg) error {
	var prevEnd int64
	for i := first; i < first+s.recs; i++ {
		_, off, size := c.rec(i)
		e := c.recs[i*c.recLen : (i+1)*c.recLen]
		hasUp := binary.LittleEndian.Uint64(e[32:])&ckptHasUp != 0
		if c.recLen == ckptRecLenV1 && hasUp {
			return fmt.Errorf("%w: record entry %d: a version 1 entry names a parent", errCheckpoint, i)
		}
		if c.recLen == ckptRecLen && !hasUp && !allZero(e[40:56]) {
			// The writer leaves the parent's bytes zero when it names
			// none: one encoding per entry.
			return fmt.Errorf("%w: record entry %d: parent bytes without a parent", errCheckpoint, i)
		}
		if off < prevEnd || off%blockSize != 0 || size < 0 || size > maxPayload || off > s.scanFrom ||
			recordSize(size) > s.scanFrom-off {
			return fmt.Errorf("%w: record entry %d out of place", errCheckpoint, i)
		}
		prevEnd = off + recordSize(size)
	}
	return nil
}

// allZero reports whether every byte of b is zero.
func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// ckptSnapshot is what a checkpoint copies from the tier under its lock.
type ckptSnapshot struct {
	nextSeg uint64
	segs    []ckptSeg
	held    []*segment       // segments referenced (refs) until the file is written
	from    map[uint64]int64 // scan-from offsets, by segment number
	recs    []slot           // a copy of the index's slots; then the records listed
}

// snapshotLocked copies the index for a checkpoint: only a memmove of the
// slots happens under the lock, the rest is settle's. Segments whose file
// is not open yet, that failed or that are being deleted are left out
// (Open scans them in full); the others are referenced so that they cannot
// be deleted before the checkpoint is written.
func (t *Tier) snapshotLocked(buf []slot) (*ckptSnapshot, error) {
	s := &ckptSnapshot{nextSeg: t.nextSeg, from: make(map[uint64]int64, len(t.segs))}
	for id, seg := range t.segs {
		select {
		case <-seg.ready: // fd and openErr are set once ready is closed
		default:
			continue
		}
		if seg.retiring || seg.failed || seg.fd < 0 || seg.openErr != nil {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstat(seg.fd, &st); err != nil {
			for _, h := range s.held {
				h.refs--
			}
			return nil, fmt.Errorf("stat %s: %w", seg.path, err)
		}
		s.from[id] = seg.tail
		s.segs = append(s.segs, ckptSeg{id: id, ino: st.Ino})
		seg.refs++
		s.held = append(s.held, seg)
	}
	s.recs = append(buf[:0], t.idx.slots...)
	return s, nil
}

// settle turns the copied slots into the records to list: a segment's
// scan-from offset is its end, or the offset of its earliest record still
// being written, and only live records of listed segments stay.
func (s *ckptSnapshot) settle() {
	for i := range s.recs {
		sl := &s.recs[i]
		if f, ok := s.from[sl.seg]; ok && sl.state == slotWriting && sl.off < f {
			s.from[sl.seg] = sl.off
		}
	}
	n := 0
	for _, sl := range s.recs {
		if _, ok := s.from[sl.seg]; ok && sl.state == slotLive {
			s.recs[n] = sl
			n++
		}
	}
	s.recs = s.recs[:n]
	for i := range s.segs {
		s.segs[i].scanFrom = s.from[s.segs[i].id]
	}
}

// checkpointNow writes a checkpoint of the index. Puts, Gets and evictions
// go on meanwhile; the lock is held only to copy the index.
func (t *Tier) checkpointNow() error {
	t.ckptMu.Lock()
	defer t.ckptMu.Unlock()
	t.mu.Lock()
	t.ckptPuts = 0
	snap, err := t.snapshotLocked(t.ckptBuf)
	t.mu.Unlock()
	if err != nil {
		return err
	}
	defer t.releaseSnapshot(snap)
	t.ckptBuf = snap.recs[:0]
	snap.settle()
	if t.opts.Sync == SyncNone {
		// Listed records must be on disk before the list is.
		for _, seg := range snap.held {
			if err := unix.Fdatasync(seg.fd); err != nil {
				return fmt.Errorf("sync %s: %w", seg.path, err)
			}
		}
	}
	return writeCheckpoint(t.dir, snap, t.ckptHook)
}

// releaseSnapshot drops the snapshot's segment references.
func (t *Tier) releaseSnapshot(s *ckptSnapshot) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, seg := range s.held {
		seg.refs--
		if !t.closed {
			t.retireIfEmptyLocked(seg)
		}
	}
}

// writeCheckpoint writes snap to dir/CHECKPOINT through a temporary file.
// hook, if set, is called between the steps (tests kill the process there).
func writeCheckpoint(dir string, snap *ckptSnapshot, hook func(string)) error {
	step := func(name string) {
		if hook != nil {
			hook(name)
		}
	}
	slices.SortFunc(snap.segs, func(a, b ckptSeg) int { return cmpU64(a.id, b.id) })
	recs := snap.recs
	slices.SortFunc(recs, func(a, b slot) int {
		if c := cmpU64(a.seg, b.seg); c != 0 {
			return c
		}
		return cmpU64(uint64(a.off), uint64(b.off))
	})
	// Records at or past scan-from (written after a slower Put reserved
	// its space) are left to the scan. Both lists are sorted by segment,
	// so one pass keeps the rest in place.
	in, out := 0, 0
	for i := range snap.segs {
		s := &snap.segs[i]
		for ; in < len(recs) && recs[in].seg == s.id; in++ {
			if r := recs[in]; r.off+recordSize(r.size) <= s.scanFrom {
				recs[out] = r
				out++
				s.recs++
			}
		}
	}
	recs = recs[:out]

	tmp := filepath.Join(dir, checkpointName+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer os.Remove(tmp) // a no-op once renamed
	w := ckptWriter{f: f, buf: make([]byte, 0, 1<<20)}
	var hdr [ckptHeaderLen]byte
	copy(hdr[:], ckptMagic[:])
	binary.LittleEndian.PutUint16(hdr[4:], ckptVersion)
	binary.LittleEndian.PutUint64(hdr[8:], snap.nextSeg)
	binary.LittleEndian.PutUint64(hdr[16:], uint64(len(snap.segs)))
	binary.LittleEndian.PutUint64(hdr[24:], uint64(len(recs)))
	w.put(hdr[:])
	for _, s := range snap.segs {
		var e [ckptSegLen]byte
		binary.LittleEndian.PutUint64(e[:], s.id)
		binary.LittleEndian.PutUint64(e[8:], s.ino)
		binary.LittleEndian.PutUint64(e[16:], uint64(s.scanFrom))
		binary.LittleEndian.PutUint64(e[24:], uint64(s.recs))
		w.put(e[:])
	}
	for _, r := range recs {
		var e [ckptRecLen]byte
		binary.LittleEndian.PutUint64(e[:], r.key.Scope)
		copy(e[8:24], r.key.Hash[:])
		binary.LittleEndian.PutUint64(e[24:], uint64(r.off))
		size := uint64(r.size)
		if r.hasUp {
			size |= ckptHasUp
			copy(e[40:56], r.up[:])
		}
		binary.LittleEndian.PutUint64(e[32:], size)
		w.put(e[:])
	}
	err = w.finish()
	step("written")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	step("synced")
	if err := os.Rename(tmp, filepath.Join(dir, checkpointName)); err != nil {
		return err
	}
	step("renamed")
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	step("done")
	return nil
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ckptWriter buffers a checkpoint's bytes and checksums them as they go out.
type ckptWriter struct {
	f   *os.File
	buf []byte
	sum xxh3.Hasher
	err error
}

func (w *ckptWriter) put(b []byte) {
	if len(w.buf)+len(b) > cap(w.buf) {
		w.flush()
	}
	w.buf = append(w.buf, b...)
}

func (w *ckptWriter) flush() {
	w.sum.Write(w.buf)
	if w.err == nil {
		_, w.err = w.f.Write(w.buf)
	}
	w.buf = w.buf[:0]
}

// finish appends the trailer and flushes.
func (w *ckptWriter) finish() error {
	w.flush()
	var tr [ckptTrailerLen]byte
	binary.LittleEndian.PutUint64(tr[:], w.sum.Sum64())
	w.put(tr[:])
	if w.err == nil {
		_, w.err = w.f.Write(w.buf)
	}
	return w.err
}

// notePutLocked counts a stored record towards the next checkpoint.
func (t *Tier) notePutLocked() {
	t.ckptDirty = true
	t.ckptPuts++
	if t.opts.CheckpointRecords > 0 && t.ckptPuts == t.opts.CheckpointRecords {
		select {
		case t.ckptKick <- struct{}{}:
		default:
		}
	}
}

// startCheckpointer starts the goroutine that writes checkpoints after
// every CheckpointRecords stored records and every CheckpointInterval.
func (t *Tier) startCheckpointer() {
	t.ckptKick = make(chan struct{}, 1)
	t.ckptStop = make(chan struct{})
	t.ckptDone = make(chan struct{})
	if t.opts.CheckpointRecords < 0 {
		close(t.ckptDone)
		return
	}
	go func() {
		defer close(t.ckptDone)
		var tick <-chan time.Time
		if t.opts.CheckpointInterval > 0 {
			tk := time.NewTicker(t.opts.CheckpointInterval)
			defer tk.Stop()
			tick = tk.C
		}
		for {
			select {
			case <-t.ckptStop:
				return
			case <-t.ckptKick:
			case <-tick:
				t.mu.Lock()
				dirty := t.ckptDirty
				t.mu.Unlock()
				if !dirty {
					continue
				}
			}
			t.writeCheckpointLogged()
		}
	}()
}

// stopCheckpointer stops the goroutine and waits for a checkpoint it is
// writing.
func (t *Tier) stopCheckpointer() {
	close(t.ckptStop)
	<-t.ckptDone
}

// finalCheckpoint writes the checkpoint of a clean stop, once nothing is in
// flight: the next Open then reads no header block at all.
func (t *Tier) finalCheckpoint() {
	if t.opts.CheckpointRecords >= 0 {
		t.writeCheckpointLogged()
	}
}

// writeCheckpointLogged writes a checkpoint; a failure only costs the next
// Open time, so it is logged, not returned.
func (t *Tier) writeCheckpointLogged() {
	start := time.Now()
	t.mu.Lock()
	t.ckptDirty = false
	t.mu.Unlock()
	if err := t.checkpointNow(); err != nil {
		t.mu.Lock()
		t.ckptDirty = true
		t.mu.Unlock()
		t.log.Warn("checkpoint failed", "err", err)
		return
	}
	t.log.Debug("checkpoint written", "took", time.Since(start))
}

// Checkpoint writes a checkpoint of the index now, besides the ones the
// tier writes on its own (Options.CheckpointRecords, CheckpointInterval and
// Close). It fails on a closed tier or one configured without checkpoints.
func (t *Tier) Checkpoint() error {
	if t.opts.CheckpointRecords < 0 {
		return errors.New("disk: checkpoints are turned off")
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return tier.ErrClosed
	}
	t.calls.Add(1) // Close waits for us before closing the files
	t.ckptDirty = false
	t.mu.Unlock()
	defer t.calls.Done()
	return t.checkpointNow()
}
