package controller

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"kvtier/cluster"
	"kvtier/cluster/member"
	"kvtier/router/index"
	"kvtier/router/ingest"
)

// testRegistry is a registry over a real subscriber and index, served by
// an httptest server, with a fast heartbeat.
type testRegistry struct {
	reg  *registry
	ix   *index.Index
	pods *index.Pods
	url  string
}

func newTestRegistry(t *testing.T, interval time.Duration) *testRegistry {
	t.Helper()
	ix, err := index.New(index.Config{MaxBlocks: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	pods := index.NewPods()
	log := slog.New(slog.DiscardHandler)
	reg := newRegistry(nil, ix, pods, interval, 3, log)
	sub, err := ingest.New(ingest.Config{OnResync: reg.onResync}, ix, pods)
	if err != nil {
		t.Fatal(err)
	}
	reg.sub = sub
	ctx, cancel := context.WithCancel(context.Background())
	if err := sub.Start(ctx); err != nil {
		t.Fatal(err)
	}
	go reg.reap(ctx)
	srv := httptest.NewServer(reg)
	t.Cleanup(func() {
		srv.Close()
		cancel()
		sub.Close()
	})
	return &testRegistry{reg: reg, ix: ix, pods: pods, url: srv.URL}
}

func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestRegistryRejectsBadBodies(t *testing.T) {
	r := newTestRegistry(t, time.Second)
	for _, tc := range []struct {
		path, body string
		status     int
		want       string
	}{
		{"register", `{"instance":"a"`, 400, "decoding"},
		{"register", `{"instance":"a","addr":"h:1","events":"tcp://h:2","admin":"http://h:3","extra":1}`, 400, "unknown field"},
		{"register", `{"instance":"a","addr":"h:1","events":"tcp://h:2","admin":"http://h:3"} {}`, 400, "after the JSON"},
		{"register", `{"instance":"a@b","addr":"h:1","events":"tcp://h:2","admin":"http://h:3"}`, 400, "'@'"},
		{"register", `{"instance":"a"}`, 400, "addr: required"},
		{"register", `{"instance":"` + strings.Repeat("a", cluster.MaxBodyBytes) + `"}`, 413, "too large"},
		{"heartbeat", `{"instance":"a","session":"x"}`, 404, "register again"},
		{"deregister", `{"instance":"a","session":"x"}`, 404, "register again"},
		{"lookup", `{"keys":["xyz"]}`, 400, "hex digits"},
		{"lookup", `{"keys":[1]}`, 400, "want strings"},
		{"lookup", `{"keys":["00000000000000001"]}`, 400, "1 to 16"},
		{"lookup", `{"keys":[` + strings.Repeat(`"1",`, cluster.MaxLookupKeys) + `"1"]}`, 413, "more than"},
		{"nothing", `{}`, 404, "no such"},
	} {
		status, body := post(t, r.url+"/v1/cluster/"+tc.path, tc.body)
		if status != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("%s %.60s: %d %s, want %d and %q", tc.path, tc.body, status, body, tc.status, tc.want)
		}
	}
}

// TestRegistryLifecycle registers a daemon whose chunk stream is a real
// member.Stream, looks its chunks up, beats, and lets it be dropped.
func TestRegistryLifecycle(t *testing.T) {
	r := newTestRegistry(t, 100*time.Millisecond)
	stream, err := member.NewStream("tcp://127.0.0.1:0", "d1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	resyncs := make(chan struct{}, 16)
	admin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/api/v1/cluster/resync" {
			resyncs <- struct{}{}
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	defer admin.Close()

	c := cluster.NewClient(r.url, nil)
	ctx := context.Background()
	reg := cluster.Register{Instance: "d1", Addr: "127.0.0.1:9", Events: "tcp://" + stream.Addr(), Admin: admin.URL,
		Tiers: []cluster.Tier{{Name: "mem", CapacityBytes: 1 << 30}}}
	got, err := c.Register(ctx, reg)
	if err != nil || got.Session == "" || got.HeartbeatIntervalMS != 100 {
		t.Fatalf("Register = %+v, %v", got, err)
	}
	// The subscription's first message asks the daemon for a resync.
	deadline := time.After(10 * time.Second)
	for waiting := true; waiting; {
		stream.Keepalive()
		if err := c.Heartbeat(ctx, "d1", got.Session); err != nil {
			t.Fatal(err)
		}
		select {
		case <-resyncs:
			waiting = false
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			t.Fatal("no resync asked after the subscription's first message")
		}
	}

	// Entries the stream would have written, straight into the index.
	id, ok := r.pods.ID(cluster.HolderPrefix + "d1")
	if !ok {
		t.Fatal("daemon not interned")
	}
	r.ix.Add(id, index.CPU, []uint64{1, 2})
	r.ix.Add(id, index.Disk, []uint64{2})
	other, _ := r.pods.Intern("vllm-pod") // routing pods are not holders
	r.ix.Add(other, index.GPU, []uint64{1})
	hs, err := c.Lookup(ctx, []uint64{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	want := [][]cluster.Holder{
		{{Instance: "d1", Addr: "127.0.0.1:9", Tier: "cpu"}},
		{{Instance: "d1", Addr: "127.0.0.1:9", Tier: "cpu"}, {Instance: "d1", Addr: "127.0.0.1:9", Tier: "disk"}},
		nil,
	}
	if !equalHolders(hs, want) {
		t.Fatalf("Lookup = %+v, want %+v", hs, want)
	}

	// Silent for three beats: dropped, with its entries.
	waitForCond(t, "the daemon to be dropped", func() bool { return len(r.reg.instances()) == 0 })
	if err := c.Heartbeat(ctx, "d1", got.Session); err == nil {
		t.Error("a dropped daemon's heartbeat was accepted")
	}
	hs, err = c.Lookup(ctx, []uint64{1, 2})
	if err != nil || len(hs[0]) != 0 || len(hs[1]) != 0 {
		t.Errorf("after the drop: %+v, %v", hs, err)
	}
}

func equalHolders(a, b [][]cluster.Holder) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return false
		}
		for j := range a[i] {
			if a[i][j] != b[i][j] {
				return false
			}
		}
	}
	return true
}

func waitForCond(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// FuzzLookupRequest feeds arbitrary bodies, JSON and binary, to the
// lookup handler: an answer or a client error, never a panic.
func FuzzLookupRequest(f *testing.F) {
	ix, err := index.New(index.Config{MaxBlocks: 1 << 10})
	if err != nil {
		f.Fatal(err)
	}
	reg := newRegistry(nil, ix, index.NewPods(), time.Second, 3, slog.New(slog.DiscardHandler))
	reg.chunkSize.Store(4)
	f.Add(false, "", []byte(`{"keys":["0123456789abcdef","1"]}`))
	f.Add(false, "", []byte(`{"keys":[]}`))
	f.Add(false, "", []byte(`{"keys":["zz"]}`))
	f.Add(false, "", []byte(`{"scope":{"model":"m"},"tokens":[1,2,3,4,5]}`))
	f.Add(true, "model=m&rank=1", []byte("\x01\x00\x00\x00\x02\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, binary bool, query string, body []byte) {
		req := httptest.NewRequest(http.MethodPost, "/v1/cluster/lookup", bytes.NewReader(body))
		req.URL.RawQuery = query
		if binary {
			req.Header.Set("Content-Type", cluster.TokensContentType)
		}
		w := httptest.NewRecorder()
		reg.ServeHTTP(w, req)
		switch w.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("%d %s", w.Code, w.Body)
		}
	})
}

// FuzzRegister feeds arbitrary bodies to the registration decoder and
// validation.
func FuzzRegister(f *testing.F) {
	f.Add([]byte(`{"instance":"a","addr":"h:1","events":"tcp://h:2","admin":"http://h:3","tiers":[{"name":"mem","capacity_bytes":1}]}`))
	f.Add([]byte(`{"instance":""}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var reg cluster.Register
		if err := cluster.Decode(bytes.NewReader(body), cluster.MaxBodyBytes, &reg); err != nil {
			return
		}
		_ = reg.Validate()
	})
}
