package disk

import (
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/zeebo/xxh3"

	"kvtier/chunk"
)

// ckptOptions turn automatic checkpoints off: the tests take them.
func ckptOptions() Options {
	return Options{Capacity: 4 << 20, SegmentSize: 256 << 10, CheckpointRecords: 1 << 30, CheckpointInterval: -1}
}

// abandon stops d the way a crash after its last acknowledged operation
// would: nothing in flight, no final checkpoint.
func abandon(d *Tier) {
	d.mu.Lock()
	d.closed = true
	d.space.Broadcast()
	d.mu.Unlock()
	d.stopCheckpointer()
	d.calls.Wait()
	d.sched.close()
	d.closeFiles()
}

// churn stores keys from..to-1 into a tier too small for them, removing
// every seventh right away and putting every fifth again later, and
// returns what must read back.
func churn(t *testing.T, d *Tier, from, to uint64, want map[chunk.Key][]byte) {
	t.Helper()
	for n := from; n < to; n++ {
		k := testKey(n)
		want[k] = testPayload(k, testSize(n, 40000))
		mustPut(t, d, k, want[k])
		if n%7 == 0 {
			d.Remove(k)
			delete(want, k)
		}
		if n%5 == 0 && n >= from+20 {
			old := testKey(n - 20)
			want[old] = testPayload(old, testSize(n-20, 40000))
			mustPut(t, d, old, want[old])
		}
	}
}

// indexState is what recovery rebuilt: every record's place, the bytes
// used, and the order in which the policy would evict.
type indexState struct {
	recs  map[chunk.Key]slot
	used  int64
	order []chunk.Key
}

// stateOf reads d's index and then drains its policy; d is of no further use.
func stateOf(d *Tier) indexState {
	s := indexState{recs: map[chunk.Key]slot{}, used: d.used}
	for i := range d.idx.slots {
		if sl := d.idx.slots[i]; sl.state == slotLive {
			s.recs[sl.key] = sl
		}
	}
	for {
		k, ok := d.idx.pol().Evict(func(chunk.Key) bool { return false })
		if !ok {
			return s
		}
		s.order = append(s.order, k)
	}
}

// copyWithoutCheckpoint copies the tier directory src, keeping holes as
// holes, and leaves the checkpoint out, so that Open scans every segment.
func copyWithoutCheckpoint(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", "--sparse=always", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	os.Remove(filepath.Join(dst, checkpointName))
	return dst
}

// TestCheckpointEqualsFullScan rebuilds the index from a checkpoint plus
// the log written after it, after a clean stop and after a stop without
// a final checkpoint, and compares it with what a full scan of a copy of
// the same files rebuilds: same records at the same places, same bytes
// used, same eviction order.
func TestCheckpointEqualsFullScan(t *testing.T) {
	for _, clean := range []bool{true, false} {
		name := map[bool]string{true: "clean stop", false: "no final checkpoint"}[clean]
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			opts := ckptOptions()
			d := openTier(t, dir, opts)
			want := map[chunk.Key][]byte{}
			churn(t, d, 0, 300, want)
			if err := d.checkpointNow(); err != nil {
				t.Fatal(err)
			}
			churn(t, d, 300, 450, want) // evicts and removes checkpointed records, appends a tail
			if clean {
				if err := d.Close(); err != nil {
					t.Fatal(err)
				}
			} else {
				abandon(d)
			}
			full := copyWithoutCheckpoint(t, dir)

			d = openTier(t, dir, opts)
			rec := d.Recovered()
			if !rec.Checkpoint || rec.FromCheckpoint == 0 || (clean && rec.FullScans != 0) {
				t.Fatalf("checkpoint not used as expected: %+v", rec)
			}
			if clean && rec.Scanned != 0 {
				t.Fatalf("after a clean stop Open read %d headers", rec.Scanned)
			}
			if !clean && rec.Scanned == 0 {
				t.Fatal("the tail written after the checkpoint was not scanned")
			}
			for k, v := range want {
				if d.Contains(k) {
					checkGet(t, d, k, v)
				}
			}
			for n := range uint64(450) {
				if n%7 == 0 && d.Contains(testKey(n)) && want[testKey(n)] == nil {
					t.Fatalf("removed key %d came back", n)
				}
			}
			d.Close()
			d = openTier(t, dir, opts) // from the checkpoint Close just wrote
			got := stateOf(d)
			abandon(d)
			f := openTier(t, full, opts)
			if rec := f.Recovered(); rec.Checkpoint || rec.FromCheckpoint != 0 {
				t.Fatalf("the copy was not scanned: %+v", rec)
			}
			ref := stateOf(f)
			abandon(f)
			if len(got.recs) != len(ref.recs) || got.used != ref.used {
				t.Fatalf("checkpoint: %d records, %d bytes; full scan: %d records, %d bytes",
					len(got.recs), got.used, len(ref.recs), ref.used)
			}
			for k, s := range ref.recs {
				if g, ok := got.recs[k]; !ok || g.seg != s.seg || g.off != s.off || g.size != s.size {
					t.Fatalf("%v: checkpoint %+v, full scan %+v", k, g, s)
				}
			}
			if !slices.Equal(got.order, ref.order) {
				t.Fatal("the eviction order differs from a full scan's")
			}
		})
	}
}

// TestBadCheckpointFallsBack damages the checkpoint in every way a crash,
// a disk or an operator could and checks that Open notices, scans, and
// loses nothing.
func TestBadCheckpointFallsBack(t *testing.T) {
	cases := map[string]func(t *testing.T, dir string, cp []byte){
		"flipped byte": func(t *testing.T, dir string, cp []byte) {
			cp[len(cp)/2] ^= 0x40
			writeFile(t, filepath.Join(dir, checkpointName), cp)
		},
		"truncated": func(t *testing.T, dir string, cp []byte) {
			writeFile(t, filepath.Join(dir, checkpointName), cp[:len(cp)-13])
		},
		"empty": func(t *testing.T, dir string, cp []byte) {
			writeFile(t, filepath.Join(dir, checkpointName), nil)
		},
		"future version": func(t *testing.T, dir string, cp []byte) {
			binary.LittleEndian.PutUint16(cp[4:], ckptVersion+1)
			writeFile(t, filepath.Join(dir, checkpointName), resum(cp))
		},
		"segment re-created": func(t *testing.T, dir string, cp []byte) {
			// Same name, same bytes, another file: the inode differs.
			for _, p := range segmentFiles(t, dir) {
				tmp := p + ".new"
				if out, err := exec.Command("cp", "--sparse=always", p, tmp).CombinedOutput(); err != nil {
					t.Fatalf("cp: %v\n%s", err, out)
				}
				if err := os.Rename(tmp, p); err != nil {
					t.Fatal(err)
				}
			}
		},
		"segment shorter": func(t *testing.T, dir string, cp []byte) {
			p := segmentFiles(t, dir)[0]
			st, _ := os.Stat(p)
			if err := os.Truncate(p, st.Size()-blockSize); err != nil {
				t.Fatal(err)
			}
		},
		"header does not match": func(t *testing.T, dir string, cp []byte) {
			// A well-formed checkpoint whose first entry names another
			// key than the header at its place.
			c, err := decodeCheckpoint(cp)
			if err != nil || len(c.recs) == 0 {
				t.Fatal(err)
			}
			cp[len(cp)-ckptTrailerLen-len(c.recs)] ^= 1 // the first record's key
			writeFile(t, filepath.Join(dir, checkpointName), resum(cp))
		},
		"parent bytes without a parent": func(t *testing.T, dir string, cp []byte) {
			// The records name no parent; the first entry's parent
			// bytes are set all the same.
			c, err := decodeCheckpoint(cp)
			if err != nil || len(c.recs) == 0 || c.recLen != ckptRecLen {
				t.Fatal(err)
			}
			cp[len(cp)-ckptTrailerLen-len(c.recs)+40] = 1
			writeFile(t, filepath.Join(dir, checkpointName), resum(cp))
		},
		"key listed twice": func(t *testing.T, dir string, cp []byte) {
			// Well-formed, and the headers checked match, but the
			// second record entry repeats the first one's key.
			c, err := decodeCheckpoint(cp)
			if err != nil || c.segs[0].recs < 3 {
				t.Fatalf("%v, %+v", err, c.segs)
			}
			recs := len(cp) - ckptTrailerLen - len(c.recs)
			copy(cp[recs+ckptRecLen:recs+ckptRecLen+24], cp[recs:recs+24])
			writeFile(t, filepath.Join(dir, checkpointName), resum(cp))
		},
	}
	for name, damage := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{Capacity: 64 << 20, SegmentSize: 256 << 10, CheckpointRecords: 1 << 30}
			d := openTier(t, dir, opts)
			want := fillTier(t, d, 40, 30000)
			d.Close()
			cp, err := os.ReadFile(filepath.Join(dir, checkpointName))
			if err != nil {
				t.Fatal(err)
			}
			damage(t, dir, cp)
			d = openTier(t, dir, opts)
			defer d.Close()
			if rec := d.Recovered(); rec.FullScans == 0 || rec.Scanned == 0 {
				t.Fatalf("a bad checkpoint was trusted: %+v", rec)
			}
			for k, v := range want {
				if name == "segment shorter" && !d.Contains(k) {
					continue // the truncation cut a record
				}
				checkGet(t, d, k, v)
			}
			if _, err := os.Stat(filepath.Join(dir, checkpointName)); !os.IsNotExist(err) {
				t.Fatalf("the bad checkpoint is still there: %v", err)
			}
		})
	}
}

// TestStaleCheckpointMissesNothing restores a checkpoint taken before
// records were removed and added: removed ones must stay gone (their bytes
// are holes), added ones must be found (past scan-from).
func TestStaleCheckpointMissesNothing(t *testing.T) {
	dir := t.TempDir()
	opts := ckptOptions()
	opts.Capacity = 64 << 20
	d := openTier(t, dir, opts)
	want := fillTier(t, d, 30, 30000)
	if err := d.checkpointNow(); err != nil {
		t.Fatal(err)
	}
	old, err := os.ReadFile(filepath.Join(dir, checkpointName))
	if err != nil {
		t.Fatal(err)
	}
	for n := uint64(0); n < 30; n += 3 {
		d.Remove(testKey(n))
		delete(want, testKey(n))
	}
	for n := uint64(30); n < 60; n++ {
		k := testKey(n)
		want[k] = testPayload(k, testSize(n, 30000))
		mustPut(t, d, k, want[k])
	}
	d.Close()
	writeFile(t, filepath.Join(dir, checkpointName), old)
	d = openTier(t, dir, opts)
	defer d.Close()
	if rec := d.Recovered(); !rec.Checkpoint || rec.FromCheckpoint != 20 || rec.Scanned != 30 {
		t.Fatalf("recovery: %+v", rec)
	}
	for n := range uint64(60) {
		k := testKey(n)
		if v, ok := want[k]; ok {
			checkGet(t, d, k, v)
		} else if d.Contains(k) {
			t.Fatalf("removed key %d came back", n)
		}
	}
}

// TestOrphanBelowScanFromIsPunched leaves a checkpointed record on disk
// that the index had dropped before the stop (an eviction whose punch a
// crash cut short): recovery must free its bytes, not index it.
func TestOrphanBelowScanFromIsPunched(t *testing.T) {
	dir := t.TempDir()
	opts := ckptOptions()
	opts.Capacity = 64 << 20
	d := openTier(t, dir, opts)
	want := fillTier(t, d, 10, 30000)
	victim := testKey(4)
	path, off := location(t, d, victim)
	n := recordSize(int64(len(want[victim])))
	saved := make([]byte, n)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(saved, off); err != nil {
		t.Fatal(err)
	}
	d.Remove(victim)
	d.Close()                                        // the checkpoint no longer lists it
	if _, err := f.WriteAt(saved, off); err != nil { // the punch "never happened"
		t.Fatal(err)
	}
	before := allocatedBytes(t, dir)
	d = openTier(t, dir, opts)
	defer d.Close()
	if d.Contains(victim) {
		t.Fatal("the orphaned copy was indexed")
	}
	if after := allocatedBytes(t, dir); before-after < n {
		t.Fatalf("the orphan's %d bytes were not freed: %d before, %d after", n, before, after)
	}
	for k, v := range want {
		if k != victim {
			checkGet(t, d, k, v)
		}
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// resum recomputes a checkpoint's trailer after a deliberate change.
func resum(b []byte) []byte {
	end := len(b) - ckptTrailerLen
	binary.LittleEndian.PutUint64(b[end:], xxh3.Hash(b[:end]))
	return b
}

// FuzzDecodeCheckpoint feeds the decoder arbitrary bytes, seeded with real
// checkpoints whose checksum is recomputed after mutation, so that the
// structural checks behind the checksum are reached. Whatever it accepts
// must satisfy what recovery relies on.
func FuzzDecodeCheckpoint(f *testing.F) {
	dir := f.TempDir()
	d := openTier(f, dir, Options{Capacity: 64 << 20, SegmentSize: 64 << 10})
	for n := range uint64(12) {
		k := testKey(n)
		if n%3 == 0 {
			mustPut(f, d, k, testPayload(k, testSize(n, 20000)))
		} else if err := d.PutAfter(context.Background(), k, testKey(n-1), testPayload(k, testSize(n, 20000))); err != nil {
			f.Fatal(err)
		}
	}
	d.Close()
	cp, err := os.ReadFile(filepath.Join(dir, checkpointName))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(cp, false)
	f.Add(checkpointV1(f, cp), false)
	f.Add(cp[:40], true)
	f.Add([]byte{}, false)
	f.Fuzz(func(t *testing.T, b []byte, fixSum bool) {
		if fixSum && len(b) >= ckptHeaderLen+ckptTrailerLen {
			b = resum(b)
		}
		c, err := decodeCheckpoint(b)
		if err != nil {
			return
		}
		n := 0
		for i, s := range c.segs {
			if s.id >= c.nextSeg || (i > 0 && s.id <= c.segs[i-1].id) {
				t.Fatalf("segment %d out of order", i)
			}
			var prev int64
			for j := n; j < n+s.recs; j++ {
				_, off, size := c.rec(j)
				if off < prev || off%blockSize != 0 || off+recordSize(size) > s.scanFrom {
					t.Fatalf("record %d out of place", j)
				}
				prev = off + recordSize(size)
			}
			n += s.recs
		}
		if n*c.recLen != len(c.recs) {
			t.Fatal("record count")
		}
		for j := range n {
			e := c.recs[j*c.recLen : (j+1)*c.recLen]
			bit := binary.LittleEndian.Uint64(e[32:])&ckptHasUp != 0
			if c.recLen == ckptRecLenV1 && bit {
				t.Fatalf("a version 1 entry %d names a parent", j)
			}
			if c.recLen == ckptRecLen && !bit && !allZero(e[40:56]) {
				t.Fatalf("entry %d has parent bytes without a parent", j)
			}
			if _, ok := c.parent(j); ok != (bit && c.recLen == ckptRecLen) {
				t.Fatalf("entry %d: parent %v with the bit %v", j, ok, bit)
			}
		}
	})
}

// TestCheckpointAfterPutsByCount checks the automatic trigger: after
// CheckpointRecords stored records a checkpoint appears without Close.
func TestCheckpointAfterPutsByCount(t *testing.T) {
	dir := t.TempDir()
	d := openTier(t, dir, Options{Capacity: 64 << 20, CheckpointRecords: 8, CheckpointInterval: -1})
	defer d.Close()
	want := fillTier(t, d, 8, 1000)
	path := filepath.Join(dir, checkpointName)
	for range 500 {
		if _, err := os.Stat(path); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	d.ckptMu.Lock() // a checkpoint being written finishes first
	b, err := os.ReadFile(path)
	d.ckptMu.Unlock()
	if err != nil {
		t.Fatalf("no checkpoint after 8 puts: %v", err)
	}
	c, err := decodeCheckpoint(b)
	if err != nil {
		t.Fatal(err)
	}
	if c.count() != len(want) {
		t.Fatalf("checkpoint lists %d records, %d stored", c.count(), len(want))
	}
}

// TestCheckpointsUnderConcurrentLoad writes checkpoints every few records
// while four goroutines put, read and remove in a tier small enough to
// evict and retire segments (run with -race), then checks that a restart
// from the last checkpoint serves exactly what a Get would have.
func TestCheckpointsUnderConcurrentLoad(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Capacity: 2 << 20, SegmentSize: 128 << 10, CheckpointRecords: 3, CheckpointInterval: time.Millisecond}
	d := openTier(t, dir, opts)
	done := make(chan struct{})
	for g := range uint64(4) {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := uint64(0); i < 150; i++ {
				n := g + 4*i
				k := testKey(n)
				if err := d.Put(context.Background(), k, testPayload(k, testSize(n, 30000))); err != nil {
					t.Error(err)
					return
				}
				if n%3 == 0 {
					d.Remove(k)
				}
				if i > 0 {
					getOutcome(t, d, testKey(n-4), testPayload(testKey(n-4), testSize(n-4, 30000)))
				}
			}
		}()
	}
	for range 4 {
		<-done
	}
	if err := d.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	live := map[chunk.Key]bool{}
	d.List(0, func(k chunk.Key, _ int) bool { live[k] = true; return true })
	abandon(d)
	d = openTier(t, dir, opts)
	defer d.Close()
	if !d.Recovered().Checkpoint {
		t.Fatal("the checkpoint was not used")
	}
	for n := range uint64(600) {
		k := testKey(n)
		if d.Contains(k) != live[k] {
			t.Fatalf("key %d: indexed %v after the restart, %v before", n, d.Contains(k), live[k])
		}
		if live[k] {
			checkGet(t, d, k, testPayload(k, testSize(n, 30000)))
		}
	}
}
