package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"kvtier/client"
	"kvtier/engine"
)

// TestLeasesMetricCountsClientLeases holds leases from two clients of a
// real daemon and checks that kvtier_arena_leases and the stats' arena
// leases count them while they are held, and drop back as they end: by
// RELEASE, and by the client's connection closing.
func TestLeasesMetricCountsClientLeases(t *testing.T) {
	p := startProc(t, t.TempDir(), "chunk_size: 16\nmax_local_cpu_size: 0.0625\n")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	checkServes(t, p.TCP, 5) // stores the prompt of salt 5
	want := func(n int) {
		t.Helper()
		if got := p.metric(t, "kvtier_arena_leases"); got != float64(n) {
			t.Errorf("kvtier_arena_leases = %v, want %d", got, n)
		}
		if got := statsLeases(t, p); got != n {
			t.Errorf("stats arena.leases = %d, want %d", got, n)
		}
	}
	want(0)

	remote, err := client.DialTCP(ctx, p.TCP, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	h, err := remote.Scope(ctx, pScope)
	if err != nil {
		t.Fatal(err)
	}
	keys := client.Tokens(h, prompt(4*remote.ChunkTokens(), 5), 0)
	hit, err := remote.Lookup(ctx, keys, 60_000)
	if err != nil || hit.Lease == 0 {
		t.Fatalf("lookup with a lease: %+v %v", hit, err)
	}
	want(1)

	local, err := client.DialUnix(ctx, p.Sock, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lh, err := local.Scope(ctx, pScope)
	if err != nil {
		t.Fatal(err)
	}
	slots, err := local.PrepareRetrieve(ctx, client.Tokens(lh, prompt(4*local.ChunkTokens(), 5), 0), 60_000)
	if err != nil || slots.Lease == 0 {
		t.Fatalf("prepare retrieve: %+v %v", slots, err)
	}
	want(2)

	if err := remote.Release(ctx, hit.Lease); err != nil {
		t.Fatal(err)
	}
	want(1)
	local.Close()
	waitFor(t, "the closed client's lease to end", func() bool { return p.metric(t, "kvtier_arena_leases") == 0 })
	want(0)
}

func statsLeases(t *testing.T, p *proc) int {
	t.Helper()
	resp, err := http.Get(p.Admin + "/api/v1/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st engine.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st.Arena.Leases
}
