package disk

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kvtier/internal/citest"
)

// mountSmallFS mounts a tmpfs of size bytes on a fresh directory and
// returns it. Filling a real file system is the only honest way to see
// ENOSPC where it comes from; filling the machine's own disk instead would
// hurt everything else on it. Mounting needs root (CAP_SYS_ADMIN): outside
// CI the test skips without it, under CI=true it fails, since CI runs as
// root by contract.
func mountSmallFS(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+strconv.FormatInt(size, 10)); err != nil {
		citest.Missing(t, "mount a %d-byte tmpfs on %s, which needs root (CI runs as root): %v", size, dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fill writes a file at path until the file system refuses more, and
// returns how many bytes it wrote.
func fill(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatalf("create filler: %v", err)
	}
	defer f.Close()
	buf := bytes.Repeat([]byte{0xfe}, 64<<10)
	var n int64
	for {
		w, err := f.Write(buf)
		n += int64(w)
		if errors.Is(err, unix.ENOSPC) {
			return n
		}
		if err != nil {
			t.Fatalf("write filler: %v", err)
		}
	}
}

// logLines counts the lines of a slog text log that carry msg.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logLines) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), msg)
}

// TestFileSystemSmallerThanCapacity gives the tier a budget eight times
// its file system: it must find that out from ENOSPC, lower its capacity
// to what fits and keep taking writes by evicting, instead of failing every
// write from then on.
func TestFileSystemSmallerThanCapacity(t *testing.T) {
	dir := mountSmallFS(t, 8<<20)
	var logs logLines
	d := openTier(t, filepath.Join(dir, "tier"), Options{Capacity: 64 << 20, SegmentSize: 1 << 20,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer d.Close()

	const n, size = 80, 256 << 10 // 80 records of 260 KiB: 20 MiB through 8 MiB
	for i := range n {
		k := testKey(uint64(i))
		if err := d.Put(context.Background(), k, testPayload(k, size)); err != nil {
			t.Fatalf("Put %d: %v", i, err)
		}
	}
	sp, st := d.Space(), d.Stats()
	if sp.ReadOnly || sp.NoSpace == 0 {
		t.Fatalf("Space = %+v, want writable after meeting ENOSPC", sp)
	}
	if sp.Capacity >= 8<<20 || st.Capacity != sp.Capacity {
		t.Fatalf("capacity in force %d (stats %d), want below the 8 MiB file system", sp.Capacity, st.Capacity)
	}
	if st.Evictions == 0 || st.Puts != n || st.Used > sp.Capacity {
		t.Fatalf("stats %+v: want evictions, %d puts, used within %d", st, n, sp.Capacity)
	}
	// The latest records are there and every record the tier claims to
	// hold reads back intact.
	checkGet(t, d, testKey(n-1), testPayload(testKey(n-1), size))
	held := 0
	for i := range n {
		if k := testKey(uint64(i)); d.Contains(k) {
			checkGet(t, d, k, testPayload(k, size))
			held++
		}
	}
	if int64(held) != st.Objects {
		t.Fatalf("%d keys readable, stats say %d objects", held, st.Objects)
	}
	if got := logs.count("capacity lowered"); got < 1 || uint64(got) > sp.NoSpace {
		t.Fatalf("%d log lines about the lowered capacity after %d ENOSPC errors, want at least one and no more than the errors", got, sp.NoSpace)
	}
}

// TestFileSystemFullForOtherReasons fills the tier's file system with
// another file: the tier must stop writing without giving up its records
// (which keep serving), report every refused write as failed, and take
// writes again on its own once the file is deleted.
func TestFileSystemFullForOtherReasons(t *testing.T) {
	dir := mountSmallFS(t, 8<<20)
	d := openTier(t, filepath.Join(dir, "tier"), Options{Capacity: 4 << 20, SegmentSize: 1 << 20})
	defer d.Close()
	d.recheck = 0 // look at the file system on every Put, so the test needs no clock

	const size = 256 << 10
	for i := range 4 {
		k := testKey(uint64(i))
		mustPut(t, d, k, testPayload(k, size))
	}
	filler := filepath.Join(dir, "filler")
	fill(t, filler)

	before := d.Stats()
	for i := 10; i < 20; i++ {
		k := testKey(uint64(i))
		err := d.Put(context.Background(), k, testPayload(k, size))
		if err == nil {
			t.Fatalf("Put %d on a full file system succeeded", i)
		}
		if i > 10 && !errors.Is(err, ErrReadOnly) {
			t.Fatalf("Put %d: %v, want ErrReadOnly once the tier knows the disk is full", i, err)
		}
		if d.Contains(k) {
			t.Fatalf("key %d is listed after its Put failed", i)
		}
	}
	sp, st := d.Space(), d.Stats()
	if !sp.ReadOnly || sp.NoSpace != 1 || sp.Refused != 9 {
		t.Fatalf("Space = %+v, want read-only after one ENOSPC and 9 refused Puts", sp)
	}
	if st.Puts != before.Puts || st.BytesWritten != before.BytesWritten || st.Objects != 4 || st.Evictions != 0 {
		t.Fatalf("stats %+v after refused Puts, were %+v: nothing may count as written or be evicted", st, before)
	}
	for i := range 4 {
		checkGet(t, d, testKey(uint64(i)), testPayload(testKey(uint64(i)), size))
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	for i := 20; i < 30; i++ {
		k := testKey(uint64(i))
		mustPut(t, d, k, testPayload(k, size))
	}
	if sp := d.Space(); sp.ReadOnly || sp.Capacity != 4<<20 {
		t.Fatalf("Space = %+v after the filler was deleted, want writable at full capacity", sp)
	}
	for i := 20; i < 30; i++ {
		checkGet(t, d, testKey(uint64(i)), testPayload(testKey(uint64(i)), size))
	}
}

// TestPutOfKeyBeingWrittenWaitsForTheOutcome: a second Put of a key whose
// first Put is still writing must not report it stored, since the first
// may yet fail (here its fdatasync does); it stores the key itself.
func TestPutOfKeyBeingWrittenWaitsForTheOutcome(t *testing.T) {
	d := openTier(t, t.TempDir(), Options{Capacity: 16 << 20, DirectIO: DirectOff})
	defer d.Close()
	mustPut(t, d, testKey(0), testPayload(testKey(0), 4096)) // creates the active segment

	inFlush, release := make(chan struct{}), make(chan struct{})
	seg := d.active
	seg.sync.mu.Lock()
	seg.sync.flush = func(int) error {
		close(inFlush)
		<-release
		return unix.EIO
	}
	seg.sync.mu.Unlock()

	k := testKey(1)
	data := testPayload(k, 8192)
	first := make(chan error, 1)
	go func() { first <- d.Put(context.Background(), k, data) }()
	<-inFlush
	second := make(chan error, 1)
	go func() { second <- d.Put(context.Background(), k, data) }()
	time.Sleep(10 * time.Millisecond) // let the second Put find the first's record; the outcome does not depend on it
	close(release)

	if err := <-first; err == nil {
		t.Fatal("the Put whose fdatasync failed succeeded")
	}
	if err := <-second; err != nil {
		t.Fatalf("second Put: %v", err)
	}
	if !d.Contains(k) {
		t.Fatal("the second Put succeeded but the key is not stored")
	}
	checkGet(t, d, k, data)
}

// TestOpenOnFullFileSystem reopens a tier whose file system another file
// has filled: Open must succeed read-only, serving the records there, and
// the tier must start writing once the file is gone.
func TestOpenOnFullFileSystem(t *testing.T) {
	dir := mountSmallFS(t, 8<<20)
	tierDir := filepath.Join(dir, "tier")
	const size = 256 << 10
	d := openTier(t, tierDir, Options{Capacity: 4 << 20, SegmentSize: 1 << 20})
	for i := range 4 {
		k := testKey(uint64(i))
		mustPut(t, d, k, testPayload(k, size))
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(dir, "filler")
	fill(t, filler)

	d = openTier(t, tierDir, Options{Capacity: 4 << 20, SegmentSize: 1 << 20})
	defer d.Close()
	d.recheck = 0
	if sp := d.Space(); !sp.ReadOnly {
		t.Fatalf("Space = %+v after opening on a full file system, want read-only", sp)
	}
	for i := range 4 {
		checkGet(t, d, testKey(uint64(i)), testPayload(testKey(uint64(i)), size))
	}
	k := testKey(10)
	if err := d.Put(context.Background(), k, testPayload(k, size)); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("Put on the full file system: %v, want ErrReadOnly", err)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	mustPut(t, d, k, testPayload(k, size))
	checkGet(t, d, k, testPayload(k, size))
	if sp := d.Space(); sp.ReadOnly {
		t.Fatalf("Space = %+v after the filler was deleted, want writable", sp)
	}
}
