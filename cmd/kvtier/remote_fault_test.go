package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/internal/faulttest"
	"kvtier/internal/redistest"
	"kvtier/wire"
)

// These tests run `kvtier serve` over a real redis-server and then make
// that server sick in the three ways a store goes wrong in production:
// hung (SIGSTOP), dead (SIGKILL) and a port that accepts connections but
// never answers. Chunks that live only in Redis must then read as misses,
// never as errors, and once the circuit breaker has cut the store off a
// RETRIEVE must not wait for it.
//
// Timing is noisy on shared machines, so the bounds asserted here are
// faulttest's, several times what the daemon is meant to meet; the measured
// figures are logged.

const (
	faultChunkTokens = 16
	faultChunkBytes  = 64 << 10
	faultTargets     = faulttest.Calls // chunks retrieved one per call while the store is sick
	faultFillers     = 40              // chunks stored after them to push them out of RAM
)

var faultScope = chunk.Scope{Model: "fault-model", WorldSize: 1, Format: "bfloat16/KV_2LTD"}

// faultRig is a daemon whose only remote tier is a Redis the test can
// make sick, with a client on its local socket.
type faultRig struct {
	d     *daemon
	c     *client.Client
	h     uint32
	redis *redistest.Server
}

// startFaultRig starts Redis and a daemon with a 1 MiB RAM tier over it,
// stores faultTargets one-chunk prompts and enough filler after them that
// the targets are held by Redis alone. remoteURL, when not empty, is the
// remote_url the daemon is given instead of Redis' own.
func startFaultRig(t *testing.T, redis *redistest.Server, remoteURL string) *faultRig {
	t.Helper()
	if remoteURL == "" {
		remoteURL = redis.URL()
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "kvtier.sock")
	conf := fmt.Sprintf("chunk_size: %d\nmax_local_cpu_size: %g\nremote_url: %q\n"+
		"admin_addr: 127.0.0.1:0\ndata_dir: %s\nsocket_path: %s\n",
		faultChunkTokens, 1.0/1024, remoteURL, dir, sock)
	path := filepath.Join(dir, "kvtier.yaml")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, []string{"KVTIER_SOCKET_PATH=" + sock}, "--config", path)
	ctx := context.Background()
	c, err := client.DialUnix(ctx, sock, client.Options{Name: "fault-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h, err := c.Scope(ctx, faultScope)
	if err != nil {
		t.Fatal(err)
	}
	r := &faultRig{d: d, c: c, h: h, redis: redis}
	for i := range faultTargets + faultFillers {
		if n, err := c.Store(ctx, r.keys(i), [][]byte{faultChunk(i)}); err != nil || n != 1 {
			t.Fatalf("store %d: %d, %v", i, n, err)
		}
		// A queued write keeps its chunk in RAM; let it land before the
		// next store needs the space. A write that misses the remote
		// deadline (50 ms in TestRemoteSilentIsAMiss, easily missed on a
		// loaded machine) is refused and not retried; FLUSH writes it
		// again.
		r.waitFor(t, "the chunk to reach Redis", func() bool {
			if r.redisStat(t).Puts > uint64(i) {
				return true
			}
			fctx, cancel := context.WithTimeout(ctx, hang)
			defer cancel()
			rep, err := c.Flush(fctx)
			return err == nil && rep.Durable()
		})
	}
	for i := range faultTargets {
		hit, err := c.Lookup(ctx, r.keys(i), 0)
		if err != nil || hit.Chunks != 1 || len(hit.ByTier) < 2 || hit.ByTier[0] != 0 {
			t.Fatalf("target %d is not held by Redis alone: %+v %v", i, hit, err)
		}
	}
	return r
}

// keys names prompt i: one chunk of tokens no other prompt starts with.
func (r *faultRig) keys(i int) wire.Keys {
	tokens := make([]uint32, faultChunkTokens)
	for j := range tokens {
		tokens[j] = uint32(i*1000 + j + 1)
	}
	return client.Tokens(r.h, tokens, 0)
}

func faultChunk(i int) []byte {
	b := make([]byte, faultChunkBytes)
	for j := range b {
		b[j] = byte(i + j)
	}
	return b
}

// retrieveAll reads each target in its own RETRIEVE and returns how long
// each call took. Every call must succeed: a sick store is a miss.
func (r *faultRig) retrieveAll(t *testing.T) []time.Duration {
	t.Helper()
	buf := [][]byte{make([]byte, faultChunkBytes)}
	took := make([]time.Duration, faultTargets)
	for i := range faultTargets {
		start := time.Now()
		n, _, err := r.c.Retrieve(context.Background(), r.keys(i), buf)
		took[i] = time.Since(start)
		if err != nil {
			t.Fatalf("RETRIEVE %d with the store sick: %v (want a miss, not an error)", i+1, err)
		}
		if n != 0 {
			t.Fatalf("RETRIEVE %d with the store sick returned %d chunks", i+1, n)
		}
	}
	return took
}

// redisStat returns the admin API's entry for the redis tier.
func (r *faultRig) redisStat(t *testing.T) tierStat {
	t.Helper()
	for _, s := range r.d.stats(t).Tiers {
		if s.Name == "redis" {
			return tierStat{Puts: s.Puts, Circuit: s.Circuit}
		}
	}
	t.Fatal("the admin API lists no redis tier")
	return tierStat{}
}

type tierStat struct {
	Puts    uint64
	Circuit string
}

// circuitMetric returns the value of kvtier_remote_circuit_state for the
// redis tier as /metrics shows it.
func (r *faultRig) circuitMetric(t *testing.T) string {
	t.Helper()
	resp, err := http.Get(r.d.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, `kvtier_remote_circuit_state{tier="redis"} `); ok {
			return v
		}
	}
	t.Fatalf("/metrics has no circuit state for redis:\n%.3000s", body)
	return ""
}

// checkOpen checks that both the admin API and /metrics show the tier cut
// off.
func (r *faultRig) checkOpen(t *testing.T) {
	t.Helper()
	if s := r.redisStat(t); s.Circuit != "open" && s.Circuit != "half-open" {
		t.Errorf("admin API shows the redis circuit %q, want open", s.Circuit)
	}
	if v := r.circuitMetric(t); v != "1" && v != "2" {
		t.Errorf("kvtier_remote_circuit_state{tier=\"redis\"} = %s, want 1 (open)", v)
	}
}

// waitRejoin polls the admin API until the redis circuit is closed again.
func (r *faultRig) waitRejoin(t *testing.T, since time.Time) {
	t.Helper()
	faulttest.WaitRejoin(t, since, func() bool { return r.redisStat(t).Circuit == "closed" })
}

func (r *faultRig) waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(hang)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s:\n%s", hang, what, r.d.stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRemoteHungIsAMiss stops Redis with SIGSTOP under a running daemon.
func TestRemoteHungIsAMiss(t *testing.T) {
	r := startFaultRig(t, redistest.Start(t), "")
	signalRedis(t, r.redis, syscall.SIGSTOP)
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			signalRedis(t, r.redis, syscall.SIGCONT)
		}
	})
	faulttest.CheckFast(t, r.retrieveAll(t))
	r.checkOpen(t)

	signalRedis(t, r.redis, syscall.SIGCONT)
	resumed = true
	r.waitRejoin(t, time.Now())
	buf := [][]byte{make([]byte, faultChunkBytes)}
	n, _, err := r.c.Retrieve(context.Background(), r.keys(0), buf)
	if err != nil || n != 1 || string(buf[0]) != string(faultChunk(0)) {
		t.Fatalf("RETRIEVE after the store came back: %d chunks, %v", n, err)
	}
	r.d.stop(t)
}

// TestRemoteKilledIsAMiss kills Redis with SIGKILL and later starts a new
// one on the same port.
func TestRemoteKilledIsAMiss(t *testing.T) {
	redis := redistest.Start(t)
	r := startFaultRig(t, redis, "")
	port := redis.Port()
	redis.Stop() // SIGKILL
	faulttest.CheckFast(t, r.retrieveAll(t))
	r.checkOpen(t)

	redistest.StartOn(t, port) // returns once the new server listens
	r.waitRejoin(t, time.Now())
	r.d.stop(t)
}

// TestRemoteSilentIsAMiss puts Redis behind a relay that, once told to,
// accepts connections and never answers on them. The URL sets its own
// deadlines, which the daemon must take out of it before the Redis tier
// (which refuses parameters it does not know) sees it.
func TestRemoteSilentIsAMiss(t *testing.T) {
	redis := redistest.Start(t)
	relay := faulttest.StartRelay(t, redis.Addr)
	r := startFaultRig(t, redis, "redis://"+relay.Addr()+"/0?timeout=50ms&bandwidth=256MiB")
	relay.Silence(true)
	faulttest.CheckFast(t, r.retrieveAll(t))
	r.checkOpen(t)

	relay.Silence(false)
	r.waitRejoin(t, time.Now())
	r.d.stop(t)
}

func signalRedis(t *testing.T, s *redistest.Server, sig syscall.Signal) {
	t.Helper()
	if err := s.Signal(sig); err != nil {
		t.Fatalf("signal %v to redis-server: %v", sig, err)
	}
}
