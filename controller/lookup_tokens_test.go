package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/cluster"
	"kvtier/cluster/member"
	"kvtier/internal/servetest"
	"kvtier/router/index"
)

// joinTestDaemon registers instance with a real chunk stream (whose
// subscription the registry opens) and the given chunk size.
func joinTestDaemon(t *testing.T, r *testRegistry, c *cluster.Client, instance string, chunkSize int) (index.PodID, error) {
	t.Helper()
	stream, err := member.NewStream("tcp://127.0.0.1:0", instance, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stream.Close() })
	_, err = c.Register(context.Background(), cluster.Register{Instance: instance, Addr: "127.0.0.1:9",
		Events: "tcp://" + stream.Addr(), Admin: "http://127.0.0.1:9", ChunkSize: chunkSize})
	if err != nil {
		return 0, err
	}
	id, ok := r.pods.ID(cluster.HolderPrefix + instance)
	if !ok {
		t.Fatalf("%s not interned", instance)
	}
	return id, nil
}

// TestLookupByTokens looks a prompt up by its tokens, in both forms, and
// finds the holders of the keys a daemon would compute for it.
func TestLookupByTokens(t *testing.T) {
	r := newTestRegistry(t, time.Second)
	c := cluster.NewClient(r.url, nil)
	ctx := context.Background()
	scope := cluster.Scope{Model: "m", WorldSize: 2, Rank: 1, Format: "bfloat16/KV_2LTD", Namespace: "team-a"}
	tokens := make([]uint32, 16*3+5) // three full chunks of 16 and a partial one
	for i := range tokens {
		tokens[i] = uint32(i * 1009)
	}

	// No daemon has given a chunk size yet: the lookup cannot cut.
	if _, _, err := c.LookupTokens(ctx, scope, tokens); err == nil || !strings.Contains(err.Error(), "chunk_size") {
		t.Fatalf("lookup by tokens with no chunk size known: %v", err)
	}

	id, err := joinTestDaemon(t, r, c, "d1", 16)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := chunk.NewChunker(chunk.Scope{Model: "m", WorldSize: 2, Rank: 1, Format: "bfloat16/KV_2LTD", Namespace: "team-a"}, 16, false)
	if err != nil {
		t.Fatal(err)
	}
	keys := ch.Keys(nil, tokens)
	r.ix.Add(id, index.CPU, []uint64{keys[0].Index(), keys[1].Index()})
	r.ix.Add(id, index.Disk, []uint64{keys[1].Index()})

	d1 := func(tier string) cluster.Holder {
		return cluster.Holder{Instance: "d1", Addr: "127.0.0.1:9", Tier: tier}
	}
	want := [][]cluster.Holder{{d1("cpu")}, {d1("cpu"), d1("disk")}, nil}
	hs, size, err := c.LookupTokens(ctx, scope, tokens)
	if err != nil || size != 16 || !equalHolders(hs, want) {
		t.Fatalf("LookupTokens = %+v, %d, %v; want %+v", hs, size, err, want)
	}

	// The JSON form answers the same, with the chunk size.
	body, _ := json.Marshal(cluster.LookupRequest{Scope: &scope, Tokens: tokens})
	status, out := post(t, r.url+"/v1/cluster/lookup", string(body))
	var reply cluster.LookupReply
	if err := json.Unmarshal([]byte(out), &reply); status != 200 || err != nil || reply.ChunkSize != 16 {
		t.Fatalf("JSON form: %d %s", status, out)
	}
	if got, err := reply.Resolve(3); err != nil || !equalHolders(got, want) {
		t.Fatalf("JSON form = %+v, %v", got, err)
	}

	// Another scope (the namespace left out) names other chunks.
	other := scope
	other.Namespace = ""
	if hs, _, err := c.LookupTokens(ctx, other, tokens); err != nil || !equalHolders(hs, [][]cluster.Holder{nil, nil, nil}) {
		t.Fatalf("other scope: %+v, %v", hs, err)
	}
}

// TestChunkSizeMixRefused: a daemon with another chunk size than the
// registered ones is refused with 409; the same daemon may change its own.
func TestChunkSizeMixRefused(t *testing.T) {
	r := newTestRegistry(t, time.Second)
	c := cluster.NewClient(r.url, nil)
	if _, err := joinTestDaemon(t, r, c, "d1", 256); err != nil {
		t.Fatal(err)
	}
	if _, err := joinTestDaemon(t, r, c, "d2", 256); err != nil {
		t.Fatal(err)
	}
	_, err := joinTestDaemon(t, r, c, "d3", 512)
	if err == nil || !strings.Contains(err.Error(), "409") || !strings.Contains(err.Error(), "chunk_size") {
		t.Fatalf("a daemon with another chunk size: %v", err)
	}
	if _, err := joinTestDaemon(t, r, c, "d4", 0); err != nil {
		t.Fatalf("a daemon that gives no chunk size: %v", err)
	}
	if n := len(r.reg.instances()); n != 3 {
		t.Fatalf("%d instances, want 3", n)
	}
}

func TestTokenLookupRejectsBadBinary(t *testing.T) {
	r := newTestRegistry(t, time.Second)
	for _, tc := range []struct{ query, body, want string }{
		{"model=m", "abc", "whole number"},
		{"model=m&colour=red", "", "unknown field"},
		{"model=m&model=n", "", "2 times"},
		{"rank=-1", "", "non-negative"},
		{"%zz", "", "query"},
	} {
		req, _ := http.NewRequest(http.MethodPost, r.url+"/v1/cluster/lookup?"+tc.query, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", cluster.TokensContentType)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(b.String(), tc.want) {
			t.Errorf("%s %q: %d %s, want 400 and %q", tc.query, tc.body, resp.StatusCode, b.String(), tc.want)
		}
	}
}

// TestClusterToken: with a token, every registry endpoint wants it.
func TestClusterToken(t *testing.T) {
	r := newTestRegistry(t, time.Second)
	srv := httptest.NewServer(clusterGuard("s3cret", r.reg, newRefusedLog(slog.New(slog.DiscardHandler))))
	defer srv.Close()
	ctx := context.Background()
	for _, token := range []string{"", "wrong", "s3cret-and-more", "S3CRET"} {
		c := cluster.NewClient(srv.URL, nil).WithToken(token)
		if _, err := c.Lookup(ctx, []uint64{1}); err == nil || !strings.Contains(err.Error(), "401") {
			t.Errorf("lookup with token %q: %v", token, err)
		}
		if err := c.Heartbeat(ctx, "d1", "x"); err == nil || !strings.Contains(err.Error(), "401") {
			t.Errorf("heartbeat with token %q: %v", token, err)
		}
	}
	for _, path := range []string{"register", "heartbeat", "deregister", "lookup", "instances"} {
		resp, err := http.Post(srv.URL+"/v1/cluster/"+path, "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s without a token: %d", path, resp.StatusCode)
		}
	}
	c := cluster.NewClient(srv.URL, nil).WithToken("s3cret")
	if _, err := joinTestDaemon(t, r, c, "d1", 16); err != nil {
		t.Fatalf("register with the token: %v", err)
	}
	if hs, err := c.Lookup(ctx, []uint64{1}); err != nil || len(hs) != 1 {
		t.Fatalf("lookup with the token: %+v, %v", hs, err)
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/cluster/instances", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("instances with the token: %v %v", resp, err)
	}
	resp.Body.Close()
}

func TestCheckOpenListener(t *testing.T) {
	for _, tc := range []struct {
		addr, token string
		refuse      bool
	}{
		{"127.0.0.1:7481", "", false},
		{"[::1]:7481", "", false},
		{"0.0.0.0:7481", "", true},
		{"[::]:7481", "", true},
		{"10.0.0.2:7481", "", true},
		{"10.0.0.2:7481", "t", false},
	} {
		addr, err := net.ResolveTCPAddr("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		err = checkOpenListener(addr, tc.token)
		if (err != nil) != tc.refuse || (err != nil && !strings.Contains(err.Error(), "cluster_token")) {
			t.Errorf("%s token %q: %v, want refused %v naming cluster_token", tc.addr, tc.token, err, tc.refuse)
		}
	}
}

// TestControllerClusterTokenCoversTheClusterAPI runs a controller with a
// cluster_token: the registry's and the operations' endpoints want it,
// the score API and health check do not.
func TestControllerClusterTokenCoversTheClusterAPI(t *testing.T) {
	cfg := validConfig()
	cfg.Pods, cfg.ClusterToken = nil, "s3cret"
	logs := &servetest.Log{}
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan error, 1)
	go func() { exited <- Run(ctx, func() {}, cfg, logs) }()
	defer func() { cancel(); <-exited }()
	url := waitListening(t, logs, exited)
	get := func(path, token string) int {
		req, _ := http.NewRequest(http.MethodGet, url+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, path := range []string{"/v1/cluster/instances", "/v1/cluster/ops", "/v1/cluster/ops/nosuch"} {
		if got := get(path, ""); got != http.StatusUnauthorized {
			t.Errorf("%s without the token: %d", path, got)
		}
		if got := get(path, "s3cret"); got == http.StatusUnauthorized {
			t.Errorf("%s with the token: %d", path, got)
		}
	}
	if got := get("/healthz", ""); got != http.StatusOK {
		t.Errorf("/healthz: %d", got)
	}
	if strings.Contains(logs.String(), "without authentication") {
		t.Errorf("a loopback controller with a token warned:\n%s", logs)
	}
}
