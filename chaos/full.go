package chaos

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"kvtier/internal/citest"
	"kvtier/internal/servetest"
)

// fullFS is the size of the tmpfs the disk-full fault mounts: far below
// the disk tier's configured 64 MiB, so the file system, not the tier's
// own capacity, is what runs out.
const fullFS = 4 << 20

// mountTmpfs mounts a tmpfs of size bytes on dir until the fault ends.
// Without the privilege to mount (root with CAP_SYS_ADMIN) the fault
// skips, or fails under CI.
func mountTmpfs(t testing.TB, dir string, size int) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, fmt.Sprintf("size=%d", size)); err != nil {
		citest.Missing(t, "cannot mount a %d-byte tmpfs on %s for a real ENOSPC (needs root with CAP_SYS_ADMIN): %v", size, dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}

// fill writes a file in dir until the file system has no space left.
func fill(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	block := make([]byte, 4096)
	for {
		if _, err := f.Write(block); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return path
			}
			t.Fatal(err)
		}
	}
}

// diskFull runs the disk tier on a small tmpfs, fills that file system
// under it while stores go on, then frees the space.
func diskFull(t testing.TB, o Options, r *Report) {
	r.Checked = "with the disk tier's file system full (ENOSPC) stores are still acknowledged, FLUSH answers (not durable) instead of hanging, nothing reads back wrong, the chunks made durable before stay, and once space is freed the disk tier writes again"
	dir := t.TempDir()
	mnt := filepath.Join(dir, "mnt")
	mountTmpfs(t, mnt, fullFS)
	conf := baseConf + fmt.Sprintf("max_local_cpu_size: 0.0078125\nlocal_disk: %s\nmax_local_disk_size: 0.0625\ndisk_segment_size: 1MiB\n",
		filepath.Join(mnt, "disk"))
	d := servetest.Start(t, dir, conf)
	run := newRun()
	c := dialTCP(t, d.TCP, run)

	const before = 16 // durable before the disk fills: about 1.1 MiB
	for i := range before {
		if ok, err := c.put(i); !ok {
			t.Fatalf("store %d: %v", i, err)
		}
	}
	if ok, rep, err := c.flush(); !ok {
		t.Fatalf("FLUSH before the disk filled not durable: %+v %v", rep, err)
	}
	filler := fill(t, mnt)
	refusedBefore := queueFailed(t, d)

	// Stores go on with no space left: RAM takes them.
	var acked []int
	deadline := time.Now().Add(o.load())
	for i := before; time.Now().Before(deadline) || i < before+64; i++ {
		if ok, err := c.put(i); !ok {
			t.Fatalf("store %d with the disk full: %v", i, err)
		}
		acked = append(acked, i)
	}
	ok, rep, err := c.flush()
	if err != nil {
		t.Fatalf("FLUSH with the disk full: %v", err)
	}
	if ok {
		t.Errorf("FLUSH with the disk full says durable: %+v", rep)
	}
	refused := queueFailed(t, d) - refusedBefore
	r.Note("disk full: %d stores acknowledged, %d disk writes refused, FLUSH reply %+v", len(acked), refused, rep.Tiers)
	lines := logLines(d.Log.String(), "level=WARN", "level=ERROR")
	r.Note("the daemon's log holds %d WARN/ERROR lines for %d refused writes: %v", lines, refused, logMessages(d.Log.String()))

	// Free the space. Chunks whose write was refused and which have left
	// RAM since stay missing in every FLUSH until stored again
	// (docs/reliability.md); what is stored now reaches the disk, and a
	// FLUSH says so by leaving nothing pending.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	const afterN = 8
	afterFrom := before + len(acked)
	var after []int
	for i := afterFrom; i < afterFrom+afterN; i++ {
		if ok, err := c.put(i); !ok {
			t.Fatalf("store %d after the space was freed: %v", i, err)
		}
		after = append(after, i)
	}
	// Recovery is the disk tier writing again: FLUSH writes again the
	// refused chunks still in RAM and the new ones, and the tier's count
	// of records put grows. The file system is far smaller than the tier,
	// so it may fill again and make the tier evict; what FLUSH then
	// reports missing stays so until stored again.
	putsFull := tierStats(t, d, "disk").Puts
	waitUntil(t, "the disk tier to write again after the space was freed", func() bool {
		c.flush()
		return tierStats(t, d, "disk").Puts > putsFull
	})
	r.Recovery = time.Since(freed)
	_, rep, _ = c.flush()
	r.Note("after the space was freed: FLUSH reply %+v (the chunks lost while the disk was full stay missing until stored again)", rep.Tiers)

	ids := make([]int, before)
	for i := range ids {
		ids[i] = i
	}
	ev := tierStats(t, d, "disk").Evictions
	r.Stored, r.Durable = before+len(acked), before
	// Durable before the disk filled, and the disk tier evicted nothing:
	// they must still be there, on disk, after a SIGKILL.
	d.Kill()
	d = servetest.Start(t, dir, conf)
	c = dialTCP(t, d.TCP, run)
	verified := r.Verified
	verify(t, c, ids, func(int) bool { return ev == 0 }, r)
	if ev != 0 {
		r.Note("the disk tier evicted %d records to make room; %d of the %d chunks flushed before the disk filled came back", ev, r.Verified-verified, before)
	}
	verify(t, c, acked, func(int) bool { return false }, r)
	// Stored after the space was freed but covered by no durable FLUSH:
	// whole or absent, never wrong.
	verify(t, c, after, func(int) bool { return false }, r)
	r.Stored += afterN
}

// queueFailed is the daemon's count of lower-tier writes refused.
func queueFailed(t testing.TB, d *servetest.Daemon) uint64 {
	t.Helper()
	var n uint64
	for _, q := range stats(t, d).Queues {
		n += q.Failed
	}
	return n
}

var msgAttr = regexp.MustCompile(`level=(?:WARN|ERROR) msg=("(?:[^"\\]|\\.)*"|\S+)`)

// logMessages counts the WARN and ERROR lines of log by message.
func logMessages(log string) map[string]int {
	out := map[string]int{}
	for _, m := range msgAttr.FindAllStringSubmatch(log, -1) {
		out[m[1]]++
	}
	return out
}

// logLines counts the lines of log holding any of marks.
func logLines(log string, marks ...string) int {
	n := 0
	for line := range strings.Lines(log) {
		for _, m := range marks {
			if strings.Contains(line, m) {
				n++
				break
			}
		}
	}
	return n
}
