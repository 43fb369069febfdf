package scale

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"golang.org/x/sys/unix"

	"kvtier/chunk"
	"kvtier/internal/proccpu"
	"kvtier/tier/disk"
)

// childEnv names the environment variable that turns a process into a
// fill child: "dir,records,tail".
const childEnv = "KVTIER_SCALE_FILL"

// recordPayload is the payload of every measured record: recovery reads
// one header block per record whatever the payload, and a small payload
// keeps a million records within a few GiB.
const recordPayload = 512

// recordChain is the length of the prefix chains the records form: record
// i names record i-1 as its parent unless i is a multiple of it (a 4,096-
// token prompt in 256-token chunks), so that recovery restores parents as
// it would in a real tier.
const recordChain = 16

// DiskRow is the disk tier at one record count.
type DiskRow struct {
	Records       int
	IndexBytes    float64 // heap bytes per record held by the open tier's index
	CheckpointB   float64 // checkpoint file bytes per record
	FullScan      time.Duration
	CleanStop     time.Duration
	Crash         time.Duration
	CleanCPU      time.Duration // CPU time (user + system, all threads) of the clean-stop Open
	CrashCPU      time.Duration // the same for the crash
	CleanPolicy   time.Duration // from the start of the clean-stop Open until the policy had every record (disk.Tier.WaitPolicy)
	CrashPolicy   time.Duration // the same for the crash
	CrashScanned  int           // records the crash recovery read from the log
	CleanScanned  int           // records the clean-stop recovery read (0 expected)
	CleanFromCkpt int
}

// PerRecord returns d per record in microseconds.
func (r DiskRow) PerRecord(d time.Duration) float64 {
	return float64(d.Microseconds()) / float64(r.Records)
}

func diskOptions() disk.Options {
	return disk.Options{Capacity: 1 << 50, Sync: disk.SyncNone, CheckpointInterval: -1}
}

// scaleKey is the key of record n.
func scaleKey(n uint64) chunk.Key {
	k := chunk.Key{Scope: 0x5ca1e}
	binary.LittleEndian.PutUint64(k.Hash[:], n)
	binary.LittleEndian.PutUint64(k.Hash[8:], n*0x9e3779b97f4a7c15)
	return k
}

// Disk measures the disk tier's restart at each record count, growing one
// directory: a child process fills it to n records, checkpoints at n-tail,
// stores tail more and is SIGKILLed; then Open is timed after the crash,
// after a clean stop (the checkpoint Close writes) and with no checkpoint
// at all (a full scan of every header block, which is what every restart
// cost before checkpoints). The page cache is emptied of the tier's files
// before each Open.
func Disk(ctx context.Context, dir string, counts []int, tail int, log io.Writer) ([]DiskRow, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var rows []DiskRow
	for _, n := range counts {
		if ctx.Err() != nil {
			return rows, ctx.Err()
		}
		fmt.Fprintf(log, "disk: filling to %d records (SIGKILL with %d after the last checkpoint)\n", n, tail)
		if err := fillChild(dir, n, min(tail, n)); err != nil {
			return rows, err
		}
		row := DiskRow{Records: n}
		o, err := timedOpen(dir, nil)
		if err != nil {
			return rows, err
		}
		row.Crash, row.CrashScanned, row.CrashCPU, row.CrashPolicy = o.rec.Duration, o.rec.Scanned, o.cpu, o.policy
		st, err := os.Stat(filepath.Join(dir, "CHECKPOINT"))
		if err != nil {
			return rows, fmt.Errorf("after the clean stop: %w", err)
		}
		row.CheckpointB = float64(st.Size()) / float64(n)
		o, err = timedOpen(dir, &row.IndexBytes)
		if err != nil {
			return rows, err
		}
		row.CleanStop, row.CleanScanned, row.CleanFromCkpt, row.CleanCPU, row.CleanPolicy = o.rec.Duration, o.rec.Scanned, o.rec.FromCheckpoint, o.cpu, o.policy
		if err := os.Remove(filepath.Join(dir, "CHECKPOINT")); err != nil {
			return rows, err
		}
		o, err = timedOpen(dir, nil)
		if err != nil {
			return rows, err
		}
		row.FullScan = o.rec.Duration
		if o.rec.Checkpoint || o.rec.Scanned != n {
			return rows, fmt.Errorf("full scan found %d of %d records", o.rec.Scanned, n)
		}
		fmt.Fprintf(log, "disk: %d records: crash %v, clean stop %v, full scan %v\n", n, row.Crash, row.CleanStop, row.FullScan)
		rows = append(rows, row)
	}
	return rows, nil
}

// opened is what timedOpen measured.
type opened struct {
	rec    disk.Recovery
	cpu    time.Duration // process CPU time (all threads) until Open returned
	policy time.Duration // wall time until the policy had every record
}

// Restart is one pair of restarts of Restarts.
type Restart struct {
	Load                 string // 1-minute load average before the crash restart
	Crash, Clean         time.Duration
	CrashCPU, CleanCPU   time.Duration
	CrashPol, CleanPol   time.Duration // until the policy had every record
	CrashRead, CleanRead int           // header blocks read
}

// Restarts measures the restart after a crash and after a clean stop runs
// times over in dir, which Disk has filled to n records: each run stores
// the last tail records again and is SIGKILLed, as in Disk.
func Restarts(ctx context.Context, dir string, n, tail, runs int, log io.Writer) ([]Restart, error) {
	var out []Restart
	for r := range runs {
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		if err := fillChild(dir, n, min(tail, n)); err != nil {
			return out, err
		}
		x := Restart{Load: loadAvg()}
		o, err := timedOpen(dir, nil)
		if err != nil {
			return out, err
		}
		x.Crash, x.CrashCPU, x.CrashPol, x.CrashRead = o.rec.Duration, o.cpu, o.policy, o.rec.Scanned
		if o, err = timedOpen(dir, nil); err != nil {
			return out, err
		}
		x.Clean, x.CleanCPU, x.CleanPol, x.CleanRead = o.rec.Duration, o.cpu, o.policy, o.rec.Scanned
		fmt.Fprintf(log, "disk: restart %d of %d records: crash %v, clean stop %v\n", r+1, n, x.Crash, x.Clean)
		out = append(out, x)
	}
	return out, nil
}

// timedOpen drops the tier's files from the page cache, opens it, checks
// that it holds what it should, and closes it (writing a checkpoint). It
// returns how Open recovered, the process CPU time Open took and when the
// policy was ready; if heap is set, it receives the heap bytes per record
// the open tier holds.
func timedOpen(dir string, heap *float64) (opened, error) {
	dropCache(dir)
	var before runtime.MemStats
	if heap != nil {
		runtime.GC()
		runtime.ReadMemStats(&before)
	}
	cpu0 := proccpu.Used()
	d, err := disk.Open(dir, diskOptions())
	cpu := proccpu.Used() - cpu0
	if err != nil {
		return opened{}, err
	}
	defer d.Close()
	o := opened{rec: d.Recovered(), cpu: cpu, policy: d.WaitPolicy()}
	st := d.Stats()
	if heap != nil {
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		*heap = (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(st.Objects)
	}
	if !d.Contains(scaleKey(0)) || !d.Contains(scaleKey(uint64(st.Objects-1))) {
		return o, errors.New("disk: a stored record is missing after the restart")
	}
	return o, nil
}

// dropCache asks the kernel to forget the cached pages of dir's files, so
// that an Open reads them from the device (only this directory's files:
// the machine is shared).
func dropCache(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		unix.Fdatasync(int(f.Fd()))
		unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		f.Close()
	}
}

// fillChild runs a child process that brings dir to n records, checkpoints
// at n-tail and is killed once it has stored the rest.
func fillChild(dir string, n, tail int) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d,%d", childEnv, dir, n, tail))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	cmd.Process.Kill()
	werr := cmd.Wait()
	if strings.TrimSpace(line) != "ready" {
		return fmt.Errorf("fill child: %q, %v", line, werr)
	}
	return nil
}

// RunChildIfAsked runs the fill child when this process was started as one
// (see fillChild) and then never returns; otherwise it returns at once.
// Binaries that run Disk call it first thing in main (tests in TestMain).
func RunChildIfAsked() {
	spec := os.Getenv(childEnv)
	if spec == "" {
		return
	}
	if err := fill(spec); err != nil {
		fmt.Fprintln(os.Stderr, "fill child:", err)
		os.Exit(2)
	}
	time.Sleep(time.Hour) // the parent kills us
	os.Exit(3)
}

func fill(spec string) error {
	parts := strings.Split(spec, ",")
	if len(parts) != 3 {
		return fmt.Errorf("bad %s %q", childEnv, spec)
	}
	n, err1 := strconv.Atoi(parts[1])
	tail, err2 := strconv.Atoi(parts[2])
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	opts := diskOptions()
	opts.CheckpointRecords = 1 << 40
	d, err := disk.Open(parts[0], opts)
	if err != nil {
		return err
	}
	have := int(d.Stats().Objects)
	if have > n-tail {
		// A directory filled by an earlier run: take the last records
		// out again, so that every run stores the same log tail.
		if err := removeFrom(d, n-tail, have); err != nil {
			return err
		}
		have = n - tail
	}
	// Four writers keep the device busy; the records are numbered
	// 0..n-1 whatever order they land in.
	put := func(to int) error {
		next := atomic.Int64{}
		next.Store(int64(have))
		var g errgroup.Group
		for range 4 {
			g.Go(func() error {
				payload := make([]byte, recordPayload)
				for i := next.Add(1) - 1; i < int64(to); i = next.Add(1) - 1 {
					binary.LittleEndian.PutUint64(payload, uint64(i))
					if err := putRecord(d, uint64(i), payload); err != nil {
						return err
					}
				}
				return nil
			})
		}
		have = to
		return g.Wait()
	}
	if err := put(n - tail); err != nil {
		return err
	}
	if err := d.Checkpoint(); err != nil {
		return err
	}
	if err := put(n); err != nil {
		return err
	}
	fmt.Println("ready")
	return nil
}

// putRecord stores record i, after its parent unless it starts a chain.
func putRecord(d *disk.Tier, i uint64, payload []byte) error {
	if i%recordChain == 0 {
		return d.Put(context.Background(), scaleKey(i), payload)
	}
	return d.PutAfter(context.Background(), scaleKey(i), scaleKey(i-1), payload)
}

// removeFrom removes the records numbered lo..hi-1 from d, four at a time
// (each Remove waits for its punch to be durable).
func removeFrom(d *disk.Tier, lo, hi int) error {
	next := atomic.Int64{}
	next.Store(int64(lo))
	var g errgroup.Group
	for range 4 {
		g.Go(func() error {
			for i := next.Add(1) - 1; i < int64(hi); i = next.Add(1) - 1 {
				if !d.Remove(scaleKey(uint64(i))) {
					return fmt.Errorf("record %d is missing", i)
				}
			}
			return nil
		})
	}
	return g.Wait()
}
