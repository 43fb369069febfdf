package main

import (
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"kvtier/cluster"
	"kvtier/internal/redistest"
	"kvtier/internal/servetest"
)

// sessions returns a controller's instances as "instance session", in
// order, nil when it does not answer.
func sessions(t *testing.T, ctrl string) []string {
	t.Helper()
	resp, err := http.Get("http://" + ctrl + "/v1/cluster/instances")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	var out struct{ Instances []cluster.Instance }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, in := range out.Instances {
		s = append(s, in.Instance+" "+in.Session)
	}
	return s
}

// namesOf keeps the instance names of sessions' lines.
func namesOf(lines []string) []string {
	var names []string
	for _, l := range lines {
		names = append(names, strings.Fields(l)[0])
	}
	return names
}

// settled waits until all n chunks of d are in RAM and on disk (the disk
// writes land after the stores return), so that its inventory no longer
// changes, and returns it.
func settled(t *testing.T, d *daemon, n int) map[uint64][]string {
	t.Helper()
	var inv map[uint64][]string
	waitFor(t, "the daemon's disk writes", func() bool {
		inv = inventory(t, d)
		for _, tiers := range inv {
			if !slices.Equal(tiers, []string{"cpu", "disk"}) {
				return false
			}
		}
		return len(inv) == n
	}, d.stderr)
	return inv
}

// TestClusterHA is issue 13's high availability end to end: two
// controller replicas on one real redis-server and three daemons, each
// naming both replicas (in different orders). Both replicas list the
// same sessions and answer the same lookups; after one replica is
// SIGKILLed the other still answers every lookup, the daemons keep
// beating through it (same sessions), and chunks stored after the kill
// appear; a daemon killed then is dropped with its chunks by the
// survivor; the restarted replica answers the same again.
func TestClusterHA(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a redis-server, two controllers and three daemons")
	}
	redis := redistest.Start(t)
	// Six missed beats (1.5 s): a loaded machine must not drop a daemon
	// while the test counts on it beating.
	const missed = 6
	flags := []string{"--index-redis", redis.URL(), "--missed-heartbeats", strconv.Itoa(missed)}
	ctrlA, ctrlB := freePort(t), freePort(t)
	a := startController(t, ctrlA, flags...)
	b := startController(t, ctrlB, flags...)
	// controller_url lists both: "http://A,http://B" (B first for d2).
	d1, sock1 := clusterDaemon(t, ctrlA+",http://"+ctrlB, "d1")
	d2, sock2 := clusterDaemon(t, ctrlB+",http://"+ctrlA, "d2")
	d3, _ := clusterDaemon(t, ctrlA+",http://"+ctrlB, "d3")
	logs := func() []*servetest.Log { return []*servetest.Log{a.stderr, b.stderr, d1.stderr, d2.stderr, d3.stderr} }
	var before []string
	waitFor(t, "both replicas to list the three daemons alike", func() bool {
		before = sessions(t, ctrlA)
		return slices.Equal(namesOf(before), []string{"d1", "d2", "d3"}) && slices.Equal(before, sessions(t, ctrlB))
	}, logs()...)

	storeChunks(t, sock1, 0, 4)
	storeChunks(t, sock2, 100, 103)
	inv1, inv2 := settled(t, d1, 4), settled(t, d2, 3)
	for _, ctrl := range []string{ctrlA, ctrlB} {
		waitFor(t, "the chunks of d1 and d2 in "+ctrl+"'s lookup", func() bool {
			return converged(ctrl, "d1", inv1) && converged(ctrl, "d2", inv2)
		}, logs()...)
	}

	// SIGKILL replica A: B answers every lookup, the daemons beat on
	// through B with the sessions they had, and new chunks appear.
	a.kill(t)
	if !converged(ctrlB, "d1", inv1) || !converged(ctrlB, "d2", inv2) {
		t.Fatal("replica B's lookups changed when A was killed")
	}
	time.Sleep((missed + 2) * 250 * time.Millisecond) // more than the missed beats that drop a daemon
	if got := sessions(t, ctrlB); !slices.Equal(got, before) {
		t.Fatalf("after A was killed B lists %q, want the same sessions %q", got, before)
	}
	storeChunks(t, sock1, 4, 8)
	inv1 = settled(t, d1, 8)
	waitFor(t, "chunks stored after the kill in B's lookup", func() bool {
		return converged(ctrlB, "d1", inv1)
	}, logs()...)

	// A daemon killed now is dropped with its chunks by the survivor.
	killed := time.Now()
	d1.cmd.Process.Kill()
	waitFor(t, "B to drop d1", func() bool { return slices.Equal(namesOf(sessions(t, ctrlB)), []string{"d2", "d3"}) }, logs()...)
	if got, err := holders(ctrlB, "d1", slices.Collect(maps.Keys(inv1))); err != nil || len(got) != 0 {
		t.Fatalf("after the drop, d1 still holds %d chunks at B (%v)", len(got), err)
	}
	t.Logf("d1 dropped by the surviving replica %v after it was killed", time.Since(killed).Round(time.Millisecond))

	// A restarted answers the same as B: sessions and lookups.
	restarted := time.Now()
	a = startController(t, ctrlA, flags...)
	waitFor(t, "the restarted A to list what B lists", func() bool {
		got := sessions(t, ctrlA)
		return len(got) == 2 && slices.Equal(got, sessions(t, ctrlB))
	}, logs()...)
	waitFor(t, "the restarted A's lookups", func() bool {
		return converged(ctrlA, "d2", inv2) && converged(ctrlB, "d2", inv2)
	}, logs()...)
	t.Logf("the restarted A answered like B %v after it started", time.Since(restarted).Round(time.Millisecond))
	if got, err := holders(ctrlA, "d1", slices.Collect(maps.Keys(inv1))); err != nil || len(got) != 0 {
		t.Fatalf("the restarted A names d1 as holder of %d chunks (%v)", len(got), err)
	}
	d2.stop(t)
	d3.stop(t)
}
