package chaos

import (
	"context"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"kvtier/internal/redistest"
	"kvtier/internal/servetest"
)

// remoteTargets chunks are made to live only in the remote store:
// remoteFillers stored after them push them out of the 1 MiB RAM tier.
const (
	remoteTargets = 12
	remoteFillers = 40
)

// remoteRig starts a daemon with a 1 MiB RAM tier over remoteURL and
// stores the targets and fillers, each made durable by FLUSH (the store
// acknowledged it, flushDurable) before the next.
func remoteRig(t testing.TB, remoteURL string) (*servetest.Daemon, *conn) {
	t.Helper()
	dir := t.TempDir()
	// LRU: the fillers push the targets out of RAM whatever else touched
	// them (a FLUSH that writes a refused chunk again takes a reference,
	// which TREELFU counts as a hit worth keeping the chunk for). So the
	// remote faults do not exercise the default TREELFU: what they test is
	// the remote tier under the daemon, with the targets read from it, and
	// the policy's choices are the policy tests' concern (tier/policy).
	d := servetest.Start(t, dir, baseConf+fmt.Sprintf("max_local_cpu_size: 0.0009765625\ncache_policy: LRU\nremote_url: %q\n", remoteURL))
	c := dialUnix(t, d.Sock, newRun())
	for i := range remoteTargets + remoteFillers {
		if ok, err := c.put(i); !ok {
			t.Fatalf("store %d: %v", i, err)
		}
		flushDurable(t, c, i)
	}
	for i := range remoteTargets {
		hit, err := c.c.Lookup(context.Background(), c.keys(i), 0)
		if err != nil || hit.Chunks != 1 || len(hit.ByTier) < 2 || hit.ByTier[0] != 0 {
			t.Fatalf("target %d is not held by the remote store alone: %+v %v", i, hit, err)
		}
	}
	return d, c
}

// flushDurable sends FLUSH after store i until a reply is durable, as a
// client that needs its stores durable does: a write that misses the
// remote deadline (easily missed on a loaded machine) is refused, and each
// FLUSH writes what the store lacks again while it is still in RAM. Only a
// durable reply makes the chunks durable. It fails the fault after hang.
func flushDurable(t testing.TB, c *conn, i int) {
	t.Helper()
	start := time.Now()
	for {
		ok, rep, err := c.flush()
		if ok {
			return
		}
		if time.Since(start) > hang {
			t.Fatalf("FLUSH after store %d not durable for %v: %+v %v", i, hang, rep, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sickReads reads every target while the store is sick: each must be a
// miss, never an error. It notes the slowest read.
func sickReads(t testing.TB, c *conn, what string, r *Report) {
	t.Helper()
	var worst time.Duration
	for i := range remoteTargets {
		start := time.Now()
		found, wrong, err := c.get(i)
		worst = max(worst, time.Since(start))
		if err != nil || wrong > 0 {
			t.Errorf("target %d with the store %s: %d wrong bytes, %v (want a miss)", i, what, wrong, err)
			r.WrongBytes += wrong
		}
		if found {
			t.Errorf("target %d was read from a %s store", i, what)
		}
	}
	r.Note("%d reads with the store %s: all misses, slowest %v", remoteTargets, what, worst.Round(time.Millisecond))
}

// storesWhileSick stores chunks while the store is sick: the daemon must
// still acknowledge them (they are in RAM).
func storesWhileSick(t testing.TB, c *conn, from, n int, r *Report) {
	t.Helper()
	for i := from; i < from+n; i++ {
		if ok, err := c.put(i); !ok {
			t.Errorf("store %d with the remote store sick: %v", i, err)
			continue
		}
		r.Stored++
	}
}

// recovered waits until target 0 reads back from the store again and
// returns how long that took.
func recovered(t testing.TB, c *conn) time.Duration {
	t.Helper()
	return waitUntil(t, "a target to read back after the store recovered", func() bool {
		found, _, err := c.get(0)
		return err == nil && found
	})
}

// pushOut stores remoteFillers chunks from id from, each made durable
// before the next, so that the targets leave RAM again. The chunks stored
// sick (ids sick, sickN of them) had their writes refused and may have
// left RAM since; every FLUSH reports those missing until they are stored
// again, which pushOut does first, as a client that needs them durable
// would.
func pushOut(t testing.TB, c *conn, from, sick, sickN int, r *Report) {
	t.Helper()
	if ok, _, _ := c.flush(); !ok {
		for i := sick; i < sick+sickN; i++ {
			if ok, err := c.put(i); !ok {
				t.Fatalf("store %d again: %v", i, err)
			}
		}
	}
	for i := from; i < from+remoteFillers; i++ {
		if ok, err := c.put(i); !ok {
			t.Fatalf("store %d: %v", i, err)
		}
		flushDurable(t, c, i)
		r.Stored++
		r.Durable++
	}
}

// verifyRemote verifies every chunk remoteRig stored (each durable) and
// notes how many calls to the remote tier name failed meanwhile, and how
// many of those missed their deadline: each such read is a miss that
// verify reads again.
func verifyRemote(t testing.TB, d *servetest.Daemon, c *conn, name string, r *Report) {
	t.Helper()
	failed, late := remoteFailures(t, d, name)
	verifyRereading(t, c, allRemote(), func(int) bool { return true }, r)
	failed2, late2 := remoteFailures(t, d, name)
	if failed2 > failed {
		r.Note("%d calls to %s failed while reading back, %d of them past their deadline", failed2-failed, name, late2-late)
	}
}

// remoteFailures reads the daemon's counts of calls to the remote tier
// name that failed, and of those that missed their deadline.
func remoteFailures(t testing.TB, d *servetest.Daemon, name string) (failed, late int) {
	t.Helper()
	count := func(metric string) int {
		sample := metric + `{tier="` + name + `"}`
		v := d.Metric(t, sample)
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatalf("%s = %q: %v", sample, v, err)
		}
		return int(n)
	}
	return count("kvtier_remote_failures_total"), count("kvtier_remote_timeouts_total")
}

func allRemote() []int {
	ids := make([]int, remoteTargets+remoteFillers)
	for i := range ids {
		ids[i] = i
	}
	return ids
}

// redisHung hangs Redis with SIGSTOP, so its port still accepts
// connections and nothing answers.
func redisHung(t testing.TB, o Options, r *Report) {
	r.Checked = "with Redis hung (SIGSTOP) chunks held only there read as misses, never errors, stores are still acknowledged, and after SIGCONT every durable chunk reads back"
	srv := redistest.Start(t)
	d, c := remoteRig(t, srv.URL())
	r.Stored, r.Durable = remoteTargets+remoteFillers, remoteTargets+remoteFillers
	if err := srv.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	sickReads(t, c, "hung", r)
	storesWhileSick(t, c, 1000, 8, r)
	time.Sleep(o.load())
	if err := srv.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	r.Recovery = recovered(t, c)
	verifyRemote(t, d, c, "redis", r)
}

// redisKilled kills Redis, which keeps an append-only file fsync'ed
// before each reply, and starts it again on the same port and files.
func redisKilled(t testing.TB, o Options, r *Report) {
	r.Checked = "with Redis killed (SIGKILL) reads are misses, never errors; restarted on its append-only file, every chunk it acknowledged reads back"
	dir := t.TempDir()
	srv := redistest.StartDurable(t, 0, dir)
	d, c := remoteRig(t, srv.URL())
	r.Stored, r.Durable = remoteTargets+remoteFillers, remoteTargets+remoteFillers
	srv.Stop()
	sickReads(t, c, "dead", r)
	storesWhileSick(t, c, 1000, 8, r)
	time.Sleep(o.load())
	redistest.StartDurable(t, srv.Port(), dir)
	r.Recovery = recovered(t, c)
	verifyRemote(t, d, c, "redis", r)
}
