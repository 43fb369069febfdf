package cluster_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"kvtier/cluster"
)

// replica is a registry stand-in answering heartbeats with status.
type replica struct {
	srv    *httptest.Server
	status atomic.Int32
	hits   atomic.Int32
}

func newReplica(t *testing.T, status int) *replica {
	r := &replica{}
	r.status.Store(int32(status))
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		r.hits.Add(1)
		w.WriteHeader(int(r.status.Load()))
		w.Write([]byte("{}"))
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func TestFailoverSkipsDeadAndFailingReplicas(t *testing.T) {
	dead := newReplica(t, http.StatusOK)
	dead.srv.Close() // connection refused from now on
	sick := newReplica(t, http.StatusServiceUnavailable)
	good := newReplica(t, http.StatusOK)
	c := cluster.NewFailoverClient([]string{dead.srv.URL, sick.srv.URL, good.srv.URL + "/"}, nil)
	ctx := context.Background()
	if err := c.Heartbeat(ctx, "d1", "s"); err != nil {
		t.Fatalf("heartbeat through the third replica: %v", err)
	}
	if c.Current() != good.srv.URL || sick.hits.Load() != 1 || good.hits.Load() != 1 {
		t.Fatalf("current %s, hits sick %d good %d", c.Current(), sick.hits.Load(), good.hits.Load())
	}
	// The replica that answered is asked first from now on.
	if err := c.Heartbeat(ctx, "d1", "s"); err != nil || sick.hits.Load() != 1 || good.hits.Load() != 2 {
		t.Fatalf("second beat: err %v, hits sick %d good %d", err, sick.hits.Load(), good.hits.Load())
	}
	// It fails: the next in turn (wrapping around) answers.
	good.status.Store(http.StatusBadGateway)
	sick.status.Store(http.StatusOK)
	if err := c.Heartbeat(ctx, "d1", "s"); err != nil || c.Current() != sick.srv.URL {
		t.Fatalf("after the good replica failed: err %v, current %s", err, c.Current())
	}
}

func TestFailoverStopsAtAnAnswer(t *testing.T) {
	// 404 (unknown session) and 400 are answers: every replica shares one
	// registry, so asking the next would say the same.
	for _, status := range []int{http.StatusNotFound, http.StatusBadRequest} {
		first := newReplica(t, status)
		second := newReplica(t, http.StatusOK)
		c := cluster.NewFailoverClient([]string{first.srv.URL, second.srv.URL}, nil)
		err := c.Heartbeat(context.Background(), "d1", "s")
		if err == nil || second.hits.Load() != 0 {
			t.Fatalf("status %d: err %v, second asked %d times", status, err, second.hits.Load())
		}
		if status == http.StatusNotFound && !errors.Is(err, cluster.ErrUnknown) {
			t.Fatalf("404: %v, want ErrUnknown", err)
		}
	}
}

func TestFailoverAllDown(t *testing.T) {
	a, b := newReplica(t, http.StatusInternalServerError), newReplica(t, http.StatusOK)
	b.srv.Close()
	c := cluster.NewFailoverClient([]string{a.srv.URL, b.srv.URL}, nil)
	err := c.Heartbeat(context.Background(), "d1", "s")
	if err == nil || a.hits.Load() != 1 {
		t.Fatalf("err %v, a asked %d times", err, a.hits.Load())
	}
	if cluster.NewFailoverClient(nil, nil).Heartbeat(context.Background(), "d1", "s") == nil {
		t.Fatal("a client of no controllers answered")
	}
}
