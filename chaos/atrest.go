package chaos

import (
	"encoding/binary"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"kvtier/internal/servetest"
)

// record is one disk-tier record found in a segment file (the layout is
// documented in tier/disk/format.go): where it starts, its payload length
// and which chunk its payload says it holds.
type record struct {
	file string
	off  int64
	n    int64
	id   int
}

const blockSize = 4096

// scanRecords lists the records of run in the disk tier's segment files,
// newest segment last, by offset within each.
func scanRecords(t testing.TB, dir string, run uint64) []record {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no segment files in %s: %v", dir, err)
	}
	slices.Sort(segs) // fixed-width hex names: lexical order is numeric order
	var out []record
	for _, seg := range segs {
		data, err := os.ReadFile(seg)
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off+blockSize <= len(data); off += blockSize {
			h := data[off : off+blockSize]
			if string(h[:4]) != "KVTD" {
				continue
			}
			n := int64(binary.LittleEndian.Uint64(h[48:]))
			p := off + blockSize
			if n < 16 || int64(p)+n > int64(len(data)) {
				continue
			}
			gotRun, id := idOf(data[p:])
			if gotRun == run {
				out = append(out, record{file: seg, off: int64(off), n: n, id: id})
			}
		}
	}
	return out
}

// atRest stores n chunks, makes them durable with FLUSH, kills the daemon
// and returns it stopped, with the records found on disk.
func atRest(t testing.TB, n int) (dir, conf string, run uint64, recs []record) {
	t.Helper()
	dir = t.TempDir()
	conf = diskConf(dir)
	d := servetest.Start(t, dir, conf)
	run = newRun()
	c := dialTCP(t, d.TCP, run)
	for i := range n {
		if ok, err := c.put(i); !ok {
			t.Fatalf("store %d: %v", i, err)
		}
	}
	if ok, rep, err := c.flush(); !ok {
		t.Fatalf("FLUSH not durable: %+v %v", rep, err)
	}
	d.Kill()
	recs = scanRecords(t, filepath.Join(dir, "disk"), run)
	if len(recs) != n {
		t.Fatalf("found %d records of %d flushed chunks on disk", len(recs), n)
	}
	return dir, conf, run, recs
}

// flipBit flips one bit of the byte at off in file.
func flipBit(t testing.TB, file string, off int64, bit uint) {
	t.Helper()
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 1 << (bit % 8)
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// afterDamage restarts the daemon on dir, reads every chunk back (those
// in damaged may be missing, no other may), then checks that the tier
// still stores: new chunks become durable and read back.
func afterDamage(t testing.TB, dir, conf string, run uint64, n int, damaged map[int]bool, r *Report) {
	t.Helper()
	start := time.Now()
	d := servetest.Start(t, dir, conf)
	c := dialTCP(t, d.TCP, run)
	if _, _, err := c.get(0); err != nil {
		t.Fatalf("first RETRIEVE after the restart: %v", err)
	}
	r.Recovery = max(r.Recovery, time.Since(start))
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i
	}
	r.Stored += n
	r.Durable += n - len(damaged)
	verify(t, c, ids, func(i int) bool { return !damaged[i] }, r)
	// Reading the damaged ones again: a damaged record dropped on the
	// first read must stay dropped.
	for i := range damaged {
		if _, wrong, err := c.get(i); err != nil || wrong > 0 {
			t.Errorf("damaged chunk %d read again: %d wrong bytes, %v", i, wrong, err)
			r.WrongBytes += wrong
		}
	}
	corrupt := tierStats(t, d, "disk").Corrupt
	for i := n; i < n+16; i++ {
		if ok, err := c.put(i); !ok {
			t.Fatalf("store %d after the repair: %v", i, err)
		}
	}
	if ok, rep, err := c.flush(); !ok {
		t.Fatalf("FLUSH after the repair not durable: %+v %v", rep, err)
	}
	d.Kill()
	d = servetest.Start(t, dir, conf)
	c = dialTCP(t, d.TCP, run)
	fresh := make([]int, 16)
	for j := range fresh {
		fresh[j] = n + j
	}
	r.Stored += 16
	r.Durable += 16
	verify(t, c, fresh, func(int) bool { return true }, r)
	r.Note("%d of %d records damaged; the disk tier counted %d corrupt reads; 16 chunks stored after the repair survived another SIGKILL",
		len(damaged), n, corrupt)
}

// diskBitflip flips one bit in the payload of every fourth record and
// one in the header of every fourth record after that.
func diskBitflip(t testing.TB, o Options, r *Report) {
	r.Checked = "a bit flipped at rest in a record's payload or header makes that chunk a miss, never wrong bytes; every undamaged durable chunk comes back, and the tier stores again"
	n := 48 * o.rounds()
	dir, conf, run, recs := atRest(t, n)
	rnd := rand.New(rand.NewPCG(run, 1))
	damaged := map[int]bool{}
	for k, rec := range recs {
		switch k % 4 {
		case 0: // payload: any byte of it
			flipBit(t, rec.file, rec.off+blockSize+rnd.Int64N(rec.n), rnd.UintN(8))
		case 1: // header: the 64 checksummed bytes
			flipBit(t, rec.file, rec.off+rnd.Int64N(64), rnd.UintN(8))
		default:
			continue
		}
		damaged[rec.id] = true
	}
	afterDamage(t, dir, conf, run, n, damaged, r)
}

// diskTruncate cuts the newest segment in the middle of the payload of
// its middle record: that record and every one after it in the segment
// are gone, every one before must come back.
func diskTruncate(t testing.TB, o Options, r *Report) {
	r.Checked = "a segment truncated mid-record loses the records from the cut on, and only those; the tier repairs the segment, reads no wrong byte, and stores again"
	n := 48 * o.rounds()
	dir, conf, run, recs := atRest(t, n)
	last := recs[len(recs)-1].file
	var inLast []record
	for _, rec := range recs {
		if rec.file == last {
			inLast = append(inLast, rec)
		}
	}
	cut := inLast[len(inLast)/2]
	if err := os.Truncate(last, cut.off+blockSize+cut.n/2); err != nil {
		t.Fatal(err)
	}
	damaged := map[int]bool{}
	for _, rec := range inLast[len(inLast)/2:] {
		damaged[rec.id] = true
	}
	afterDamage(t, dir, conf, run, n, damaged, r)
}
