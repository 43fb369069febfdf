package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"kvtier/admin"
	"kvtier/chunk"
	"kvtier/client"
	"kvtier/cluster"
	"kvtier/internal/servetest"
)

// The cluster tests run a real `kvtier controller` and real `kvtier
// serve` daemons on loopback, each with its own ports, socket and
// directories, and look at the controller's index through its lookup API.

const (
	clusterChunkTokens = 16
	clusterChunkBytes  = 64 << 10
)

var clusterScope = chunk.Scope{Model: "cluster-model", WorldSize: 1, Format: "bfloat16/KV_2LTD"}

// controllerProc is a running `kvtier controller`.
type controllerProc struct {
	cmd    *exec.Cmd
	stderr *servetest.Log
	exited chan error
}

// freePort returns a loopback port nobody listened on a moment ago: the
// controller must come back on the same address after a restart.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startController runs a controller on addr with 250 ms beats, plus
// extra flags.
func startController(t *testing.T, addr string, extra ...string) *controllerProc {
	t.Helper()
	bin, err := servetest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"controller", "--listen", addr, "--hash-seed", "0", "--heartbeat-interval", "250ms"}, extra...)
	p := &controllerProc{cmd: exec.Command(bin, args...),
		stderr: &servetest.Log{}, exited: make(chan error, 1)}
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() { p.cmd.Process.Kill() })
	waitFor(t, "the controller to listen", func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	}, p.stderr)
	return p
}

// kill stops the process without letting it clean up.
func (p *controllerProc) kill(t *testing.T) {
	t.Helper()
	p.cmd.Process.Kill()
	select {
	case <-p.exited:
	case <-time.After(hang):
		t.Fatal("controller still running after SIGKILL")
	}
}

// clusterDaemon starts a daemon that joins the controller at ctrl, with a
// RAM tier of 1 MiB (16 chunks) over a disk tier.
func clusterDaemon(t *testing.T, ctrl, instance string) (*daemon, string) {
	t.Helper()
	return clusterDaemonWith(t, ctrl, instance, "")
}

// clusterDaemonWith is clusterDaemon with more configuration lines.
func clusterDaemonWith(t *testing.T, ctrl, instance, extra string) (*daemon, string) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "kvtier.sock")
	conf := fmt.Sprintf("chunk_size: %d\nmax_local_cpu_size: %g\nlocal_disk: file://%s/disk\nmax_local_disk_size: 0.05\n"+
		"admin_addr: 127.0.0.1:0\ndata_dir: %s\nsocket_path: %s\ntcp_addr: 127.0.0.1:0\n"+
		"controller_url: http://%s\ninstance_id: %s\ncluster_events_endpoint: tcp://127.0.0.1:0\n",
		clusterChunkTokens, 1.0/1024, dir, dir, sock, ctrl, instance) + extra
	path := filepath.Join(dir, "kvtier.yaml")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return startDaemon(t, []string{"KVTIER_SOCKET_PATH=" + sock}, "--config", path), sock
}

func waitFor(t *testing.T, what string, ok func() bool, logs ...*servetest.Log) {
	t.Helper()
	deadline := time.Now().Add(hang)
	for !ok() {
		if time.Now().After(deadline) {
			for _, l := range logs {
				t.Log(l.String())
			}
			t.Fatalf("gave up after %v waiting for %s", hang, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func instances(t *testing.T, ctrl string) []string {
	t.Helper()
	resp, err := http.Get("http://" + ctrl + "/v1/cluster/instances")
	if err != nil {
		return nil // restarting
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

// inventory lists a daemon's chunks as index keys, with the lookup tier
// names of the tiers holding each ("cpu" for RAM, "disk").
func inventory(t *testing.T, d *daemon) map[uint64][]string {
	t.Helper()
	resp, err := http.Get(d.url + "/api/v1/keys?limit=10000")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list admin.KeyList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || list.Truncated {
		t.Fatalf("keys: %v (truncated %v)", err, list.Truncated)
	}
	out := map[uint64][]string{}
	for _, k := range list.Keys {
		scope, err1 := strconv.ParseUint(k.Scope, 16, 64)
		h, err2 := hex.DecodeString(k.Hash)
		if err1 != nil || err2 != nil || len(h) != 16 {
			t.Fatalf("key %+v", k)
		}
		var key chunk.Key
		key.Scope = scope
		copy(key.Hash[:], h)
		tier := map[string]string{"mem": "cpu", "disk": "disk"}[k.Tier]
		out[key.Index()] = append(out[key.Index()], tier)
		slices.Sort(out[key.Index()])
	}
	return out
}

// holders looks keys up at the controller and returns, per key, the tiers
// instance holds it in.
func holders(ctrl, instance string, keys []uint64) (map[uint64][]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hs, err := cluster.NewClient("http://"+ctrl, nil).Lookup(ctx, keys)
	if err != nil {
		return nil, err
	}
	out := map[uint64][]string{}
	for i, list := range hs {
		for _, h := range list {
			if h.Instance == instance {
				out[keys[i]] = append(out[keys[i]], h.Tier)
				slices.Sort(out[keys[i]])
			}
		}
	}
	return out, nil
}

// converged reports whether the controller sees exactly want for instance.
func converged(ctrl, instance string, want map[uint64][]string) bool {
	keys := make([]uint64, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	got, err := holders(ctrl, instance, keys)
	if err != nil || len(got) != len(want) {
		return false
	}
	for k, tiers := range want {
		if !slices.Equal(got[k], tiers) {
			return false
		}
	}
	return true
}

func storeChunks(t *testing.T, sock string, from, to int) {
	t.Helper()
	ctx := context.Background()
	c, err := client.DialUnix(ctx, sock, client.Options{Name: "cluster-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h, err := c.Scope(ctx, clusterScope)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, clusterChunkBytes)
	for i := from; i < to; i++ {
		tokens := clusterTokens(i)
		clusterPayload(i, data)
		// A chunk whose disk write is still queued stays in RAM, so a
		// store into a full RAM tier waits for those writes to land.
		deadline := time.Now().Add(hang)
		for {
			n, err := c.Store(ctx, client.Tokens(h, tokens, 0), [][]byte{data})
			if err != nil || n == 1 {
				if err != nil {
					t.Fatalf("store %d: %v", i, err)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("store %d: RAM still full after %v", i, hang)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// clusterTokens are the tokens of test chunk i: one chunk's worth, so
// each chunk is the first of its own prompt.
func clusterTokens(i int) []uint32 {
	tokens := make([]uint32, clusterChunkTokens)
	for j := range tokens {
		tokens[j] = uint32(i*1000 + j + 1)
	}
	return tokens
}

// clusterPayload fills data with test chunk i's bytes, different in every
// byte position and from chunk to chunk, so a byte comparison catches a
// wrong chunk, a shifted one or a torn one.
func clusterPayload(i int, data []byte) {
	for j := range data {
		data[j] = byte(i*131 + j*7 + j>>8)
	}
}

// TestClusterRegistryIndexAndResync is issue 13's registry step end to
// end: daemons register; chunks stored on one appear in the controller's
// lookup in RAM and disk, then in disk alone once RAM evicts them; a
// restarted controller gets the whole index back by resync; a killed
// daemon is dropped with its chunks after missed heartbeats.
func TestClusterRegistryIndexAndResync(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a controller and two daemons")
	}
	ctrl := freePort(t)
	c := startController(t, ctrl)
	d1, sock1 := clusterDaemon(t, ctrl, "d1")
	d2, _ := clusterDaemon(t, ctrl, "d2")
	waitFor(t, "both daemons to register", func() bool {
		return slices.Equal(instances(t, ctrl), []string{"d1", "d2"})
	}, c.stderr, d1.stderr, d2.stderr)

	// Four chunks fit RAM: each is held in RAM and on disk.
	storeChunks(t, sock1, 0, 4)
	var first map[uint64][]string
	waitFor(t, "daemon 1's disk writes", func() bool {
		first = inventory(t, d1)
		for _, tiers := range first {
			if !slices.Equal(tiers, []string{"cpu", "disk"}) {
				return false
			}
		}
		return len(first) == 4
	}, d1.stderr)
	waitFor(t, "the controller to see daemon 1's chunks in RAM and on disk", func() bool {
		return converged(ctrl, "d1", first)
	}, c.stderr, d1.stderr)
	if got, _ := holders(ctrl, "d2", keysOf(first)); len(got) != 0 {
		t.Fatalf("daemon 2 credited with daemon 1's chunks: %v", got)
	}

	// Forty more push the first ones out of the 1 MiB RAM tier.
	storeChunks(t, sock1, 4, 44)
	var all map[uint64][]string
	waitFor(t, "the controller to see the first chunks on disk only", func() bool {
		all = inventory(t, d1)
		for k := range first {
			if !slices.Equal(all[k], []string{"disk"}) {
				return false
			}
		}
		return converged(ctrl, "d1", all)
	}, c.stderr, d1.stderr)

	// A controller restart loses the index; heartbeats get 404, the
	// daemons register again and resync.
	c.kill(t)
	c = startController(t, ctrl)
	waitFor(t, "the daemons to register with the new controller", func() bool {
		return slices.Equal(instances(t, ctrl), []string{"d1", "d2"})
	}, c.stderr, d1.stderr)
	waitFor(t, "the index to come back whole by resync", func() bool {
		return converged(ctrl, "d1", inventory(t, d1))
	}, c.stderr, d1.stderr)

	// A killed daemon misses its beats and is dropped with its chunks.
	killed := time.Now()
	d1.cmd.Process.Kill()
	waitFor(t, "daemon 1 to be dropped", func() bool {
		return slices.Equal(instances(t, ctrl), []string{"d2"})
	}, c.stderr)
	got, err := holders(ctrl, "d1", keysOf(all))
	if err != nil || len(got) != 0 {
		t.Fatalf("after the drop, daemon 1 still holds %d chunks (%v)", len(got), err)
	}
	t.Logf("daemon 1 dropped %v after it was killed", time.Since(killed).Round(time.Millisecond))
	d2.stop(t)
}

func keysOf(m map[uint64][]string) []uint64 {
	keys := make([]uint64, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}
