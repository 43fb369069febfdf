package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/cluster"
	"kvtier/config"
	"kvtier/tier/p2p"
)

// fakeLookup answers every key with the same holders, after delay.
func fakeLookup(t *testing.T, reply cluster.LookupReply, delay time.Duration, asked *[][]string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Keys []string }
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Error(err)
		}
		if asked != nil {
			*asked = append(*asked, req.Keys)
		}
		time.Sleep(delay)
		out := cluster.LookupReply{Daemons: reply.Daemons}
		for range req.Keys {
			out.Holders = append(out.Holders, reply.Holders[0])
		}
		json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func peersOf(t *testing.T, url string, timeout time.Duration) *controllerPeers {
	t.Helper()
	cfg := config.Default()
	cfg.EnableP2P, cfg.ControllerURL, cfg.RemoteTimeout = true, url, timeout
	r := p2pResolver(cfg, slog.New(slog.DiscardHandler))
	if r == nil {
		t.Fatal("no controller resolver with enable_p2p and controller_url")
	}
	return r
}

// The controller's holders become peers: this daemon left out by instance
// id or by address, RAM before disk, each daemon once.
func TestControllerPeersExcludeSelfAndPreferRAM(t *testing.T) {
	reply := cluster.LookupReply{
		Daemons: []cluster.Daemon{{Instance: "me", Addr: "127.0.0.1:1"}, {Instance: "d2", Addr: "127.0.0.1:2"},
			{Instance: "d3", Addr: "127.0.0.1:3"}, {Instance: "renamed", Addr: "127.0.0.1:9"}},
		Holders: [][]cluster.HolderAt{{{Daemon: 0, Tier: "cpu"}, {Daemon: 1, Tier: "disk"}, {Daemon: 2, Tier: "cpu"},
			{Daemon: 1, Tier: "cpu"}, {Daemon: 3, Tier: "cpu"}}},
	}
	srv := fakeLookup(t, reply, 0, nil)
	r := peersOf(t, srv.URL, time.Second)
	r.setSelf("me", "127.0.0.1:9")
	got, err := r.resolver().Holders(context.Background(), []chunk.Key{{Scope: 1}, {Scope: 2}})
	if err != nil {
		t.Fatal(err)
	}
	want := []p2p.Peer{{Instance: "d3", Addr: "127.0.0.1:3", Tier: "mem"}, {Instance: "d2", Addr: "127.0.0.1:2", Tier: "mem"}}
	if len(got) != 2 || !slices.Equal(got[0], want) || !slices.Equal(got[1], want) {
		t.Fatalf("holders = %v, want %v twice", got, want)
	}
}

// Keys go by their index key, in batches the controller accepts.
func TestControllerPeersBatchesIndexKeys(t *testing.T) {
	var asked [][]string
	reply := cluster.LookupReply{Daemons: []cluster.Daemon{{Instance: "d2", Addr: "h:2"}},
		Holders: [][]cluster.HolderAt{{{Daemon: 0, Tier: "disk"}}}}
	srv := fakeLookup(t, reply, 0, &asked)
	r := peersOf(t, srv.URL, time.Second)
	keys := make([]chunk.Key, cluster.MaxLookupKeys+3)
	for i := range keys {
		keys[i] = chunk.Key{Scope: uint64(i)}
	}
	got, err := r.resolver().Holders(context.Background(), keys)
	if err != nil || len(got) != len(keys) {
		t.Fatalf("%d rows, %v", len(got), err)
	}
	if len(asked) != 2 || len(asked[0]) != cluster.MaxLookupKeys || len(asked[1]) != 3 {
		t.Fatalf("batches of %d", len(asked))
	}
	if want := fmt.Sprintf("%016x", keys[5].Index()); asked[0][5] != want {
		t.Fatalf("key 5 sent as %q, want its index key %s", asked[0][5], want)
	}
}

// A controller slower than the remote timeout costs an error (a miss),
// within about that timeout.
func TestControllerPeersBoundedByRemoteTimeout(t *testing.T) {
	reply := cluster.LookupReply{Holders: [][]cluster.HolderAt{nil}}
	srv := fakeLookup(t, reply, 400*time.Millisecond, nil)
	r := peersOf(t, srv.URL, 50*time.Millisecond)
	start := time.Now()
	_, err := r.resolver().Holders(context.Background(), []chunk.Key{{Scope: 1}})
	if err == nil || !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("err = %v, want a deadline", err)
	}
	if took := time.Since(start); took > 300*time.Millisecond {
		t.Fatalf("lookup took %v with a 50ms remote timeout", took)
	}
}

// p2p_peers win over the controller; without enable_p2p the controller
// is not asked for peers.
func TestP2PResolverChoice(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := config.Default()
	cfg.ControllerURL = "http://c:1"
	if p2pResolver(cfg, log) != nil {
		t.Error("controller resolver without enable_p2p")
	}
	cfg.EnableP2P, cfg.P2PPeers = true, []string{"10.0.0.2:7482"}
	if p2pResolver(cfg, log) != nil {
		t.Error("controller resolver despite p2p_peers")
	}
}
