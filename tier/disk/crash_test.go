package disk

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The crash test re-executes this test binary as a child that stores chunks
// and reports each acknowledged Put and Remove on stdout; the parent kills
// it with SIGKILL at a random point and checks what survived.
const (
	crashDirEnv  = "KVTIER_DISK_CRASH_DIR"
	crashBaseEnv = "KVTIER_DISK_CRASH_BASE"
	crashModeEnv = "KVTIER_DISK_CRASH_DIRECT"
	crashChurn   = "KVTIER_DISK_CRASH_CHURN"
	crashCkpt    = "KVTIER_DISK_CRASH_CHECKPOINT"
	// crashSlowWarm holds the child's policy goroutine back this many
	// milliseconds after Open, so that Puts, Removes and evictions run,
	// and the kill may land, while the policy takes in the checkpoint.
	crashSlowWarm = "KVTIER_DISK_CRASH_SLOW_WARM"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashDirEnv); dir != "" {
		crashChild(dir)
		return
	}
	os.Exit(m.Run())
}

func crashOptions(mode DirectMode, churn bool) Options {
	if churn { // constant eviction
		return Options{Capacity: 1 << 20, SegmentSize: 128 << 10, DirectIO: mode}
	}
	return Options{Capacity: 1 << 30, SegmentSize: 512 << 10, DirectIO: mode}
}

func crashSize(n uint64) int { return testSize(n, 128<<10) }

// removable says which keys the child removes right after storing them.
func removable(n uint64) bool { return n%5 == 0 }

// crashChild runs four goroutines storing keys and printing "P n" once
// Put(n) has returned and "R n" once Remove(n) has, until killed. Goroutine g
// owns keys base+g, base+g+4, ...; each acts on its keys in order.
//
// Plain mode: put each key once; remove the removable ones right after.
// Churn mode, in a tier far too small: put key i, put key i-1 again (a new
// copy if it was evicted meanwhile), then remove key i-2 for good — so
// Removes race with evictions of older copies of the same key.
func crashChild(dir string) {
	base, _ := strconv.ParseUint(os.Getenv(crashBaseEnv), 10, 64)
	mode, _ := strconv.Atoi(os.Getenv(crashModeEnv))
	churn := os.Getenv(crashChurn) != ""
	ckpt := os.Getenv(crashCkpt) != ""
	opts := crashOptions(DirectMode(mode), churn)
	if ckpt {
		opts = crashCkptOptions(opts)
	}
	if ms, err := strconv.Atoi(os.Getenv(crashSlowWarm)); err == nil {
		warmHold = func() { time.Sleep(time.Duration(ms) * time.Millisecond) }
	}
	d, err := Open(dir, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(2)
	}
	var out sync.Mutex
	report := func(what string, n uint64) {
		out.Lock()
		fmt.Fprintf(os.Stdout, "%s %d\n", what, n) // one write(2): a whole line or nothing
		out.Unlock()
	}
	if ckpt {
		// Say where each checkpoint is, and linger there, so the parent's
		// SIGKILL lands between the steps of writing it.
		d.ckptHook = func(step string) {
			report("C", uint64(slices.Index(ckptSteps, step)))
			time.Sleep(3 * time.Millisecond)
		}
	}
	put := func(n uint64) {
		k := testKey(n)
		if err := d.Put(context.Background(), k, testPayload(k, crashSize(n))); err != nil {
			fmt.Fprintln(os.Stderr, "put:", err)
			os.Exit(3)
		}
		report("P", n)
	}
	remove := func(n uint64) {
		if d.Remove(testKey(n)) {
			report("R", n)
		}
	}
	for g := range uint64(4) {
		go func() {
			for i := uint64(0); ; i++ {
				n := base + g + 4*i
				put(n)
				switch {
				case !churn:
					if removable(n) {
						remove(n)
					}
				case i >= 2:
					put(n - 4)
					remove(n - 8)
				case i == 1:
					put(n - 4)
				}
			}
		}()
	}
	time.Sleep(time.Minute) // the parent kills us long before
	os.Exit(4)
}

func TestCrashRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(2026, 7))
	put, removed := map[uint64]bool{}, map[uint64]bool{}
	const trials = 24
	for trial := range trials {
		base := uint64(trial) * 1_000_000
		mode := DirectAuto
		if trial%3 == 2 {
			mode = DirectOff
		}
		acks := r.IntN(50) // 0: kill during start-up and recovery
		seen := runCrashChild(t, dir, base, mode, false, acks, time.Duration(r.IntN(30))*time.Millisecond, put, removed)

		d := openTier(t, dir, crashOptions(DirectAuto, false))
		// A key that may be removed may or may not be there: its Remove
		// may or may not have happened.
		checkAfterCrash(t, d, trial, base, seen, put, removed, removable)
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d acknowledged puts, %d acknowledged removes over %d kills", len(put), len(removed), trials)
	if len(put) == 0 {
		t.Fatal("no child ever acknowledged a put")
	}
}

// TestCrashWithEvictionChurn kills children that keep a tiny tier evicting
// while they re-put and remove keys: removed keys must stay removed (no
// older, evicted copy may resurface) and nothing may read back wrong.
func TestCrashWithEvictionChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(2026, 8))
	put, removed := map[uint64]bool{}, map[uint64]bool{}
	const trials = 12
	for trial := range trials {
		base := uint64(trial) * 1_000_000
		seen := runCrashChild(t, dir, base, DirectAuto, true, 5+r.IntN(80), 0, put, removed)
		d := openTier(t, dir, crashOptions(DirectAuto, true))
		evictable := func(uint64) bool { return true } // the tier churns
		checkAfterCrash(t, d, trial, base, seen, put, removed, evictable)
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d acknowledged puts, %d acknowledged removes over %d kills", len(put), len(removed), trials)
	if len(removed) == 0 {
		t.Fatal("no child ever acknowledged a remove")
	}
}

// checkAfterCrash checks a tier reopened after a child was killed: no key
// whose Remove was acknowledged is there, every other acknowledged key
// reads back its bytes unless mayVanish says it may be gone (then it is
// whole or absent), and puts in flight at the kill are never wrong.
func checkAfterCrash(t *testing.T, d *Tier, trial int, base, seen uint64, put, removed map[uint64]bool, mayVanish func(n uint64) bool) {
	t.Helper()
	for n := range put {
		k := testKey(n)
		want := testPayload(k, crashSize(n))
		switch {
		case removed[n]:
			if d.Contains(k) {
				t.Fatalf("trial %d: key %d came back after its Remove was acknowledged", trial, n)
			}
		case mayVanish(n):
			getOutcome(t, d, k, want)
		default:
			checkGet(t, d, k, want)
		}
	}
	checkUnacknowledged(t, d, base, seen, put)
}

// checkUnacknowledged reads keys a child may have been storing when it was
// killed: each may be present, absent or torn, but never wrong.
func checkUnacknowledged(t *testing.T, d *Tier, base, seen uint64, put map[uint64]bool) {
	t.Helper()
	for n := base; n < base+seen+40; n++ {
		if !put[n] {
			k := testKey(n)
			getOutcome(t, d, k, testPayload(k, crashSize(n)))
		}
	}
}

// runCrashChild runs one child, SIGKILLs it after it acknowledged acks
// operations (or after delay, if acks is 0), records every acknowledgement
// it printed before dying, and returns how many keys it reported.
func runCrashChild(t *testing.T, dir string, base uint64, mode DirectMode, churn bool, acks int, delay time.Duration,
	put, removed map[uint64]bool) uint64 {
	t.Helper()
	kill := func(_ string, count int) bool { return count == acks }
	return runCrashChildUntil(t, dir, base, mode, churn, false, kill, acks == 0, delay, put, removed)
}

// runCrashChildUntil is runCrashChild with the moment of the kill chosen by
// kill, asked with each line the child prints and the number of lines
// before it (or after delay, if early), and with checkpoints in the child
// if ckpt.
func runCrashChildUntil(t *testing.T, dir string, base uint64, mode DirectMode, churn, ckpt bool,
	kill func(line string, count int) bool, early bool, delay time.Duration, put, removed map[uint64]bool) uint64 {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		crashDirEnv+"="+dir,
		fmt.Sprintf("%s=%d", crashBaseEnv, base),
		fmt.Sprintf("%s=%d", crashModeEnv, mode))
	if churn {
		cmd.Env = append(cmd.Env, crashChurn+"=1")
	}
	if ckpt {
		cmd.Env = append(cmd.Env, crashCkpt+"=1")
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var hung atomic.Bool
	watchdog := time.AfterFunc(30*time.Second, func() { hung.Store(true); cmd.Process.Kill() })
	defer watchdog.Stop()
	if early {
		time.Sleep(delay)
		cmd.Process.Kill()
	}
	var seen uint64
	lines := bufio.NewScanner(stdout)
	for count := 0; lines.Scan(); count++ {
		if kill(lines.Text(), count) {
			cmd.Process.Kill() // lines already in the pipe still count
		}
		var what string
		var n uint64
		if _, err := fmt.Sscanf(lines.Text(), "%s %d", &what, &n); err != nil {
			t.Fatalf("child said %q", lines.Text())
		}
		switch what {
		case "C":
			continue
		case "R":
			removed[n] = true
		default:
			put[n] = true
		}
		seen = max(seen, n-base+1)
	}
	err = cmd.Wait()
	if hung.Load() {
		t.Fatalf("child made no progress for 30s\n%s", stderr.String())
	}
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != -1 {
		t.Fatalf("child did not die by our signal: %v\n%s", err, stderr.String())
	}
	return seen
}

// TestEmptiedSegmentDeletionIsDurable: a key found twice at Open (a crash
// cut short the punch of its older copy) keeps the later copy, and the
// punch of the older one empties its segment, which Open deletes. That
// deletion must be durable before Open returns: the punch itself is not
// synced, and if a crash after a later, acknowledged Remove of the key
// brought the segment back, the older copy would be served again.
func TestEmptiedSegmentDeletionIsDurable(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Capacity: 20 * recordSize(chainRec), Headroom: -1,
		SegmentSize: 64 << 10, CheckpointRecords: -1, CheckpointInterval: -1}
	d := openTier(t, dir, opts)
	k := testKey(1)
	mustPut(t, d, k, testPayload(k, chainRec))
	for i := range 8 { // the later copy goes to a later segment
		x := testKey(uint64(60000 + i))
		mustPut(t, d, x, testPayload(x, chainRec))
	}
	path, off := location(t, d, k)
	saved := make([]byte, recordSize(chainRec))
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.ReadAt(saved, off)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	d.Remove(k)
	newer := testPayload(testKey(2), chainRec)
	mustPut(t, d, k, newer)
	if p, _ := location(t, d, k); p == path {
		t.Fatal("the later copy is in the older copy's segment")
	}
	abandon(d)
	// The older copy's segment as a crash may leave it: holding that copy
	// alone, its punch lost.
	os.Remove(path)
	f, err = os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(saved, off); err != nil {
		t.Fatal(err)
	}
	f.Close()

	synced := false
	dirSynced = func(string) {
		if _, err := os.Stat(path); os.IsNotExist(err) {
			synced = true
		}
	}
	defer func() { dirSynced = nil }()
	d = openTier(t, dir, opts)
	defer d.Close()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the emptied segment is still there: %v", err)
	}
	if !synced {
		t.Fatal("Open returned before the emptied segment's deletion was synced")
	}
	checkGet(t, d, k, newer)
}
