package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/cluster"
	"kvtier/config"
	"kvtier/internal/servetest"
)

// clusterKey is test chunk i's full key, "scope/hash", as the daemons
// derive it (the default namespace mixed into the scope).
func clusterKey(t *testing.T, i int) chunk.Key {
	t.Helper()
	s := clusterScope
	if s.Namespace == "" {
		s.Namespace = config.Default().Namespace
	}
	c, err := chunk.NewChunker(s, clusterChunkTokens, false)
	if err != nil {
		t.Fatal(err)
	}
	return c.Keys(nil, clusterTokens(i))[0]
}

// clusterCLI runs `kvtier cluster <args> --json` against the controller
// at ctrl and returns the operation it printed and whether it exited 0.
func clusterCLI(t *testing.T, ctrl string, args ...string) (cluster.Op, bool) {
	t.Helper()
	bin, err := servetest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	args = append([]string{"cluster"}, args...)
	args = append(args, "--controller", "http://"+ctrl, "--json")
	cmd := exec.Command(bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(hang):
		cmd.Process.Kill()
		t.Fatalf("kvtier %s did not finish in %v", strings.Join(args, " "), hang)
	}
	var op cluster.Op
	if jerr := json.Unmarshal(stdout.Bytes(), &op); jerr != nil {
		t.Fatalf("kvtier %s: %v, output %q, stderr %q", strings.Join(args, " "), jerr, stdout.String(), stderr.String())
	}
	t.Logf("kvtier %s → %s in %s", strings.Join(args[:2], " "), op.State, opTook(op))
	return op, err == nil
}

// opTook is how long an operation ran, from the controller's times.
func opTook(op cluster.Op) string {
	return elapsed(op.Created, op.Finished)
}

// result returns instance's result in op.
func result(t *testing.T, op cluster.Op, instance string) cluster.DaemonResult {
	t.Helper()
	for _, r := range op.Results {
		if r.Instance == instance {
			return r
		}
	}
	t.Fatalf("operation %s has no result for %s: %+v", op.ID, instance, op.Results)
	return cluster.DaemonResult{}
}

// mustOK checks op succeeded on every daemon and returns instance's counts.
func mustOK(t *testing.T, op cluster.Op, ok bool, instance string) map[string]int {
	t.Helper()
	if !ok || op.State != cluster.StateOK {
		t.Fatalf("operation %s %s: %s (exit 0: %v): %+v", op.ID, op.Kind, op.State, ok, op.Results)
	}
	return result(t, op, instance).Counts
}

func wantCounts(t *testing.T, what string, got map[string]int, want map[string]int) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("%s: %s = %d, want %d (counts %v)", what, k, got[k], v, got)
		}
	}
}

// TestClusterOperations is issue 13's cluster operations end to end, with
// a real controller, three real daemons and the CLI: a pinned chunk
// survives eviction pressure that evicts its unpinned neighbour, and
// leaves RAM once unpinned; chunks move between the tiers of a daemon;
// a chunk moves to another daemon and leaves its source; chunks copied
// to another daemon are read byte-exact there with the source stopped;
// a clear of one tier and scope empties it in the controller's index;
// and a stopped daemon yields an error entry while the others succeed.
func TestClusterOperations(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a controller and three daemons")
	}
	ctrl := freePort(t)
	c := startController(t, ctrl)
	d1, sock1 := clusterDaemon(t, ctrl, "d1")
	d2, sock2 := clusterDaemon(t, ctrl, "d2")
	d3, _ := clusterDaemon(t, ctrl, "d3")
	waitFor(t, "three daemons to register", func() bool {
		return slices.Equal(instances(t, ctrl), []string{"d1", "d2", "d3"})
	}, c.stderr, d1.stderr, d2.stderr, d3.stderr)
	key := func(i int) string { return clusterKey(t, i).String() }
	ix := func(i int) uint64 { return clusterKey(t, i).Index() }

	// Pin chunk 0 in d1's RAM, then push 40 more chunks through its 16:
	// chunk 0 stays in RAM, chunk 1 (unpinned, stored with it) does not.
	storeChunks(t, sock1, 0, 4)
	op, ok := clusterCLI(t, ctrl, "pin", "--instance", "d1", "--ttl", "5m", key(0))
	wantCounts(t, "pin", mustOK(t, op, ok, "d1"), map[string]int{"pinned": 1, "pinned_mem": 1, "missing": 0})
	storeChunks(t, sock1, 4, 44)
	inv := inventory(t, d1)
	if !slices.Contains(inv[ix(0)], "cpu") {
		t.Fatalf("pinned chunk 0 left RAM under eviction pressure: %v", inv[ix(0)])
	}
	if !slices.Equal(inv[ix(1)], []string{"disk"}) {
		t.Fatalf("unpinned chunk 1 is in %v, want evicted to disk: the pressure proves nothing", inv[ix(1)])
	}
	op, ok = clusterCLI(t, ctrl, "unpin", "--instance", "d1", key(0))
	wantCounts(t, "unpin", mustOK(t, op, ok, "d1"), map[string]int{"unpinned": 1})
	storeChunks(t, sock1, 44, 64)
	if got := inventory(t, d1)[ix(0)]; !slices.Equal(got, []string{"disk"}) {
		t.Fatalf("unpinned chunk 0 is in %v after more pressure, want disk only", got)
	}

	// Between d1's tiers: chunk 1 moves up into RAM alone, chunk 63 (in
	// RAM and on disk) moves down onto disk alone.
	op, ok = clusterCLI(t, ctrl, "move", "--instance", "d1", "--to-tier", "mem", key(1))
	wantCounts(t, "move to RAM", mustOK(t, op, ok, "d1"), map[string]int{"copied": 1, "dropped_elsewhere": 1})
	op, ok = clusterCLI(t, ctrl, "move", "--instance", "d1", "--to-tier", "disk", key(63))
	counts := mustOK(t, op, ok, "d1")
	wantCounts(t, "move to disk", counts, map[string]int{"dropped_elsewhere": 1})
	if counts["copied"]+counts["already"] != 1 { // already, unless its write was still queued
		t.Fatalf("move to disk: counts %v", counts)
	}
	inv = inventory(t, d1)
	if !slices.Equal(inv[ix(1)], []string{"cpu"}) || !slices.Equal(inv[ix(63)], []string{"disk"}) {
		t.Fatalf("after the moves chunk 1 is in %v (want cpu), chunk 63 in %v (want disk)", inv[ix(1)], inv[ix(63)])
	}
	waitFor(t, "the controller to see the moves", func() bool { return converged(ctrl, "d1", inventory(t, d1)) },
		c.stderr, d1.stderr)

	// d1 → d2: chunk 2 moves (d1 drops it once d2 confirmed), chunks 5
	// and 6 are copied.
	op, ok = clusterCLI(t, ctrl, "move", "--instance", "d1", "--to", "d2", key(2))
	mustOK(t, op, ok, "d2")
	wantCounts(t, "move's destination", result(t, op, "d2").Counts, map[string]int{"pulled": 1, "missing": 0})
	wantCounts(t, "move's source", result(t, op, "d1").Counts, map[string]int{"dropped": 1})
	op, ok = clusterCLI(t, ctrl, "copy", "--instance", "d1", "--to", "d2", key(5), key(6))
	wantCounts(t, "copy", mustOK(t, op, ok, "d2"), map[string]int{"pulled": 2, "bytes": 2 * clusterChunkBytes})
	// Forty chunks, more than d2's RAM holds: they land on its disk.
	var forty []string
	for i := 7; i < 47; i++ {
		forty = append(forty, key(i))
	}
	op, ok = clusterCLI(t, ctrl, append([]string{"copy", "--instance", "d1", "--to", "d2"}, forty...)...)
	wantCounts(t, "copy of 40", mustOK(t, op, ok, "d2"), map[string]int{"pulled": 40, "bytes": 40 * clusterChunkBytes})
	waitFor(t, "the controller to see chunk 2 on d2 only and chunks 5, 6 on both", func() bool {
		on1, err1 := holders(ctrl, "d1", []uint64{ix(2), ix(5), ix(6)})
		on2, err2 := holders(ctrl, "d2", []uint64{ix(2), ix(5), ix(6)})
		return err1 == nil && err2 == nil && len(on1[ix(2)]) == 0 && len(on1[ix(5)]) > 0 &&
			len(on2[ix(2)]) > 0 && len(on2[ix(5)]) > 0 && len(on2[ix(6)]) > 0
	}, c.stderr, d1.stderr, d2.stderr)

	// Clear d1's disk of the test's scope: the index no longer lists any
	// of d1's chunks on disk, and RAM keeps its own.
	scope := fmt.Sprintf("%016x", clusterKey(t, 0).Scope)
	op, ok = clusterCLI(t, ctrl, "clear", "--instance", "d1", "--tier", "disk", "--scope", scope)
	if n := mustOK(t, op, ok, "d1")["removed_disk"]; n < 40 {
		t.Fatalf("clear removed %d chunks from d1's disk, want the 60 or so stored there", n)
	}
	var all []uint64
	for i := range 64 {
		all = append(all, ix(i))
	}
	waitFor(t, "the controller to list none of d1's chunks on disk", func() bool {
		got, err := holders(ctrl, "d1", all)
		if err != nil || len(got) == 0 {
			return false
		}
		for _, tiers := range got {
			if slices.Contains(tiers, "disk") {
				return false
			}
		}
		return true
	}, c.stderr, d1.stderr)

	// With d1 stopped, d2 serves the copied chunks byte-exact.
	d1.cmd.Process.Kill()
	for _, i := range append([]int{2, 5, 6}, seq(7, 47)...) {
		if hit, _ := retrieveChunk(t, sock2, i); !hit {
			t.Fatalf("chunk %d, copied to d2, missed there with d1 stopped", i)
		}
	}

	// A stopped daemon: an error entry, the others succeed, exit non-zero.
	op, ok = clusterCLI(t, ctrl, "clear", "--instance", "d1", "--instance", "d2", "--instance", "d3", "--model", "no-such-model")
	if ok || op.State != cluster.StatePartial {
		t.Fatalf("clear with d1 down: %s, exit 0: %v, want partial and a failure", op.State, ok)
	}
	if r := result(t, op, "d1"); r.State != cluster.StateError || r.Error == "" {
		t.Fatalf("d1's entry: %+v, want an error", r)
	} else {
		t.Logf("d1's entry: %s", r.Error)
	}
	for _, name := range []string{"d2", "d3"} {
		if r := result(t, op, name); r.State != cluster.StateOK {
			t.Fatalf("%s's entry: %+v, want ok", name, r)
		}
	}
	d2.stop(t)
	d3.stop(t)
}

func seq(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}
