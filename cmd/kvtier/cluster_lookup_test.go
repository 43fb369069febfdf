package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"kvtier/client"
	"kvtier/cluster"
)

// TestClusterLookupByTokensWithToken runs a controller that requires a
// cluster token and two daemons as processes: the daemon with the token
// joins and its chunks, stored through its protocol, are found by a
// lookup by tokens at the controller, and reach a third daemon over P2P
// through the controller; the daemon without it is refused.
func TestClusterLookupByTokensWithToken(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a controller and two daemons")
	}
	const token = "cluster-s3cret"
	ctrl := freePort(t)
	c := startController(t, ctrl, "--cluster-token", token)
	d1, sock1 := clusterDaemonWith(t, ctrl, "d1", "controller_token: "+token+"\n")
	d2, _ := clusterDaemon(t, ctrl, "d2") // no token
	// d3 finds its P2P peers through the controller, with the token.
	d3, sock3 := clusterDaemonWith(t, ctrl, "d3", "controller_token: "+token+"\n"+p2pViaController)
	api := cluster.NewClient("http://"+ctrl, nil).WithToken(token)
	waitFor(t, "d1 and d3 to register", func() bool { return len(instancesWith(t, ctrl, token)) == 2 }, c.stderr, d1.stderr, d3.stderr)
	waitFor(t, "d2 to be refused", func() bool { return strings.Contains(d2.stderr.String(), "401") }, d2.stderr)

	// A prompt of three chunks and a partial one, stored through d1's
	// socket as an engine would.
	prompt := make([]uint32, 3*clusterChunkTokens+5)
	for i := range prompt {
		prompt[i] = uint32(50_000 + i*37)
	}
	storePrompt(t, sock1, prompt, 3)

	scope := cluster.Scope{Model: clusterScope.Model, WorldSize: clusterScope.WorldSize, Rank: clusterScope.Rank,
		Format: clusterScope.Format, Namespace: clusterScope.Namespace}
	ctx := context.Background()
	var hs [][]cluster.Holder
	waitFor(t, "the prompt's chunks in the index", func() bool {
		var size int
		var err error
		hs, size, err = api.LookupTokens(ctx, scope, prompt)
		if err != nil || size != clusterChunkTokens || len(hs) != 3 {
			return false
		}
		for _, h := range hs {
			if len(h) == 0 || h[0].Instance != "d1" || h[0].Tier != "cpu" {
				return false
			}
		}
		return true
	}, c.stderr, d1.stderr)
	t.Logf("holders by tokens: %+v", hs)

	// Without the token the controller answers nothing.
	if _, _, err := cluster.NewClient("http://"+ctrl, nil).LookupTokens(ctx, scope, prompt); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("lookup without the token: %v", err)
	}
	// Another model's prompt of the same tokens is held by nobody.
	scope.Model = "another-model"
	if hs, _, err := api.LookupTokens(ctx, scope, prompt); err != nil || len(hs) != 3 || len(hs[0]) != 0 {
		t.Fatalf("another model: %+v, %v", hs, err)
	}
	if names := instancesWith(t, ctrl, token); len(names) != 2 || names[0] != "d1" || names[1] != "d3" {
		t.Fatalf("instances %v, want d1 and d3", names)
	}

	// d3's P2P lookups present the token: a chunk on d1 reaches d3.
	storeChunks(t, sock1, 0, 1)
	scope.Model = clusterScope.Model
	waitFor(t, "chunk 0 in the index", func() bool {
		hs, _, err := api.LookupTokens(ctx, scope, clusterTokens(0))
		return err == nil && len(hs) == 1 && len(hs[0]) > 0
	}, c.stderr, d1.stderr)
	mustP2P(t, d3, sock3, 0, "d1")
}

// storePrompt stores the first n chunks of prompt through the daemon's
// socket, each chunk's bytes clusterPayload of its index.
func storePrompt(t *testing.T, sock string, prompt []uint32, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	c, err := client.DialUnix(ctx, sock, client.Options{Name: "cluster-lookup-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h, err := c.Scope(ctx, clusterScope)
	if err != nil {
		t.Fatal(err)
	}
	data := make([][]byte, n)
	for i := range data {
		data[i] = make([]byte, clusterChunkBytes)
		clusterPayload(i, data[i])
	}
	stored, err := c.Store(ctx, client.Tokens(h, prompt[:n*clusterChunkTokens], 0), data)
	if err != nil || stored != n {
		t.Fatalf("stored %d of %d chunks: %v", stored, n, err)
	}
}

// instancesWith lists the registered instances, presenting token.
func instancesWith(t *testing.T, ctrl, token string) []string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+ctrl+"/v1/cluster/instances", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var out struct{ Instances []cluster.Instance }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, in := range out.Instances {
		names = append(names, in.Instance)
	}
	return names
}
