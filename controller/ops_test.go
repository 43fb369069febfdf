package controller

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"kvtier/admin"
	"kvtier/chunk"
	"kvtier/cluster"
	"kvtier/config"
	"kvtier/engine"
)

// opDaemon is a real daemon's engine and admin API in this process, with
// four chunks stored in RAM and on disk.
func opDaemon(t *testing.T, name string) cluster.Instance {
	t.Helper()
	eng, err := engine.Open(engine.Options{ChunkSize: 16, RAMBytes: 1 << 20, Policy: "LRU",
		DiskDir: t.TempDir(), DiskBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	tokens := make([]uint32, 4*16)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	chunks := make([][]byte, 4)
	for i := range chunks {
		chunks[i] = make([]byte, 4096)
	}
	scope := chunk.Scope{Model: "m", WorldSize: 1, Format: "bfloat16/KV_2LTD"}
	if n, err := eng.Store(context.Background(), engine.Request{Scope: scope, Tokens: tokens}, chunks); n != 4 || err != nil {
		t.Fatalf("stored %d: %v", n, err)
	}
	api, err := admin.New(eng, config.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	return cluster.Instance{Register: cluster.Register{Instance: name, Addr: "127.0.0.1:1", Admin: srv.URL}}
}

// hungDaemon answers nothing until the request is given up: a daemon
// whose process is stopped, or whose host is unreachable.
func hungDaemon(t *testing.T, name string) cluster.Instance {
	t.Helper()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(func() { close(release); srv.Close() })
	return cluster.Instance{Register: cluster.Register{Instance: name, Addr: "127.0.0.1:1", Admin: srv.URL}}
}

func newTestTracker(members ...cluster.Instance) *opTracker {
	return newOpTracker(func() ([]cluster.Instance, error) { return members, nil }, slog.New(slog.DiscardHandler))
}

// TestOpFanOut: one result per daemon — real daemons succeed with their
// counts, a hung daemon is an error at the deadline instead of a hang,
// an unregistered one an error at once — and the operation is partial.
func TestOpFanOut(t *testing.T) {
	tr := newTestTracker(opDaemon(t, "d1"), opDaemon(t, "d2"), hungDaemon(t, "hung"))
	id, err := tr.start(cluster.OpRequest{Kind: cluster.OpClear, Instances: []string{"d1", "d2", "hung", "ghost"},
		Tier: "cpu", TimeoutMS: 300})
	if err != nil {
		t.Fatal(err)
	}
	tr.wait()
	op, ok := tr.get(id)
	if !ok || op.State != cluster.StatePartial || op.Finished == "" || len(op.Results) != 4 {
		t.Fatalf("operation: %+v", op)
	}
	for i, want := range []struct{ name, state, err string }{
		{"d1", cluster.StateOK, ""}, {"d2", cluster.StateOK, ""},
		{"hung", cluster.StateError, "deadline"}, {"ghost", cluster.StateError, "not registered"},
	} {
		r := op.Results[i]
		if r.Instance != want.name || r.State != want.state || !strings.Contains(r.Error, want.err) {
			t.Errorf("result %d: %+v, want %s %s %q", i, r, want.name, want.state, want.err)
		}
	}
	for _, r := range op.Results[:2] {
		if r.Counts["removed_mem"] != 4 {
			t.Errorf("%s cleared %v, want 4 chunks from RAM", r.Instance, r.Counts)
		}
	}
	// Cleared: a second clear finds nothing, on both, and is ok.
	id, _ = tr.start(cluster.OpRequest{Kind: cluster.OpClear, Instances: []string{"d1", "d2"}, Tier: "mem"})
	tr.wait()
	if op, _ := tr.get(id); op.State != cluster.StateOK || op.Results[0].Counts["removed_mem"] != 0 {
		t.Fatalf("second clear: %+v", op)
	}
}

// TestOpMoveNeedsConfirmation: a move whose destination fails never asks
// its source to drop anything.
func TestOpMoveNeedsConfirmation(t *testing.T) {
	src := opDaemon(t, "src")
	tr := newTestTracker(src, hungDaemon(t, "dst"))
	key := cluster.ChunkKey{Scope: 1}
	id, err := tr.start(cluster.OpRequest{Kind: cluster.OpMove, Instances: []string{"src"}, To: "dst",
		Keys: []cluster.ChunkKey{key}, TimeoutMS: 200})
	if err != nil {
		t.Fatal(err)
	}
	tr.wait()
	op, _ := tr.get(id)
	if op.State != cluster.StateError || op.Results[0].Role != "destination" || op.Results[1].Role != "source" ||
		op.Results[1].Started != "" || !strings.Contains(op.Results[1].Error, "did not confirm") {
		t.Fatalf("move with a hung destination: %+v", op)
	}
}

func TestOpHistoryBounded(t *testing.T) {
	tr := newTestTracker()
	if _, err := tr.start(cluster.OpRequest{Kind: cluster.OpClear, All: true}); err == nil {
		t.Fatal("an operation on all of no daemons was started")
	}
	var ids []string
	for range maxOpHistory + 10 {
		id, err := tr.start(cluster.OpRequest{Kind: cluster.OpClear, Instances: []string{"ghost"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		tr.wait()
	}
	list := tr.list()
	if len(list) != maxOpHistory || list[0].ID != ids[len(ids)-1] || list[len(list)-1].ID != ids[10] {
		t.Fatalf("history of %d, first %s, last %s", len(list), list[0].ID, list[len(list)-1].ID)
	}
	if _, ok := tr.get(ids[9]); ok {
		t.Fatal("an operation past the history is still known")
	}
}

func TestOpsHTTP(t *testing.T) {
	tr := newTestTracker(hungDaemon(t, "hung"))
	srv := httptest.NewServer(tr)
	defer srv.Close()
	call := func(method, path, body string) (int, string, http.Header) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	for _, c := range []struct {
		method, path, body string
		status             int
	}{
		{"POST", "/v1/cluster/ops", `{"kind":"clear","all":true,"bogus":1}`, 400},
		{"POST", "/v1/cluster/ops", `{"kind":"clear","all":true} {}`, 400},
		{"POST", "/v1/cluster/ops", `{"kind":"clear"}`, 400},
		{"POST", "/v1/cluster/ops", `{"kind":"clear","all":true,"model":"` + strings.Repeat("x", cluster.MaxOpBodyBytes) + `"}`, 413},
		{"DELETE", "/v1/cluster/ops", ``, 405},
		{"POST", "/v1/cluster/ops/abc", ``, 405},
		{"GET", "/v1/cluster/ops/abc", ``, 404},
		{"GET", "/v1/cluster/ops/a/b", ``, 404},
		{"GET", "/v1/cluster/ops", ``, 200},
	} {
		if status, body, _ := call(c.method, c.path, c.body); status != c.status {
			t.Errorf("%s %s %.60s: %d %s, want %d", c.method, c.path, c.body, status, body, c.status)
		}
	}
	// Operations on a hung daemon run until their deadline: the tracker
	// takes maxRunningOps of them, then refuses.
	for i := range maxRunningOps + 1 {
		status, body, hdr := call("POST", "/v1/cluster/ops", `{"kind":"clear","all":true,"timeout_ms":60000}`)
		want := http.StatusAccepted
		if i == maxRunningOps {
			want = http.StatusTooManyRequests
		}
		if status != want {
			t.Fatalf("operation %d: %d %s, want %d", i, status, body, want)
		}
		if i == 0 {
			var id string
			fmt.Sscanf(body, `{"id":%q}`, &id)
			loc := hdr.Get("Location")
			if loc != "/v1/cluster/ops/"+id {
				t.Fatalf("Location %q for %s", loc, body)
			}
			if status, body, _ := call("GET", loc, ""); status != 200 || !strings.Contains(body, `"state":"running"`) {
				t.Fatalf("GET %s: %d %s", loc, status, body)
			}
		}
	}
}
