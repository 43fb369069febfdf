package main

import (
	"bytes"
	"strings"
	"testing"

	"kvtier/cluster"
)

const cliKey = "00000000000000ab/000102030405060708090a0b0c0d0e0f"

// TestClusterCLIRequest: flags and arguments make the request the
// controller gets, and bad ones fail before anything is sent.
func TestClusterCLIRequest(t *testing.T) {
	f := &clusterFlags{instances: []string{"d1"}, to: "d2", toTier: "cpu", keys: []string{cliKey}}
	r, err := f.request(cluster.OpMove, []string{"1/ffffffffffffffffffffffffffffffff"})
	if err != nil || len(r.Keys) != 2 || r.Keys[1].Scope != 1 || r.ToTier != "mem" || !r.Between() {
		t.Fatalf("move: %+v, %v", r, err)
	}
	f = &clusterFlags{all: true, scope: "0xAB", tier: "disk"}
	if r, err = f.request(cluster.OpClear, nil); err != nil || r.Scope != 0xab {
		t.Fatalf("clear: %+v, %v", r, err)
	}
	for _, c := range []struct {
		f    clusterFlags
		kind string
		args []string
		err  string
	}{
		{clusterFlags{all: true, scope: "xyz"}, cluster.OpClear, nil, "--scope"},
		{clusterFlags{all: true}, cluster.OpPin, []string{cliKey}, "ttl_ms"},
		{clusterFlags{all: true, ttl: 1e9}, cluster.OpPin, []string{"nope"}, "chunk key"},
		{clusterFlags{}, cluster.OpUnpin, []string{cliKey}, "instances or all"},
	} {
		if _, err := c.f.request(c.kind, c.args); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s %+v %v: %v, want an error about %s", c.kind, c.f, c.args, err, c.err)
		}
	}
}

// TestClusterCLIPrint: one line per daemon with its counts or error, and
// an error (a non-zero exit) unless the operation is ok.
func TestClusterCLIPrint(t *testing.T) {
	op := cluster.Op{ID: "abc", Kind: cluster.OpClear, State: cluster.StatePartial, Results: []cluster.DaemonResult{
		{Instance: "d1", State: cluster.StateError, Error: "connection refused"},
		{Instance: "d2", State: cluster.StateOK, Counts: map[string]int{"removed_mem": 3, "removed_disk": 5},
			Started: "2026-01-01T00:00:00Z", Finished: "2026-01-01T00:00:00.012Z"},
	}}
	var out bytes.Buffer
	err := (&clusterFlags{}).printOp(&out, op)
	if err == nil || !strings.Contains(err.Error(), "partial") {
		t.Fatalf("a partial operation printed without an error: %v", err)
	}
	want := "operation abc clear: partial\n" +
		"  d1                       error    connection refused\n" +
		"  d2                       ok       removed_disk=5 removed_mem=3 (12ms)\n"
	if out.String() != want {
		t.Fatalf("printed\n%s\nwant\n%s", out.String(), want)
	}
	op.State = cluster.StateOK
	if err := (&clusterFlags{}).printOp(&bytes.Buffer{}, op); err != nil {
		t.Fatalf("an ok operation: %v", err)
	}
}
