package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/chunk"
	"kvtier/cluster"
	"kvtier/cluster/member"
	"kvtier/internal/redistest"
	"kvtier/router/index"
	"kvtier/router/ingest"
	"kvtier/router/redisindex"
)

// sharedReplica is one controller replica's registry over a shared
// Redis: its own client, pod names, index handle and subscriber, as a
// separate process would have, served by an httptest server.
type sharedReplica struct {
	reg  *sharedRegistry
	url  string
	stop func()
}

func startSharedReplica(t *testing.T, srv *redistest.Server, interval time.Duration) *sharedReplica {
	return startSharedReplicaMissed(t, srv, interval, 3)
}

func startSharedReplicaMissed(t *testing.T, srv *redistest.Server, interval time.Duration, missed int) *sharedReplica {
	t.Helper()
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	pods := index.NewPods()
	ix, err := redisindex.New(redisindex.Config{Client: rdb}, pods)
	if err != nil {
		t.Fatal(err)
	}
	reg := newSharedRegistry(rdb, ix, pods, interval, missed, slog.New(slog.DiscardHandler))
	sub, err := ingest.New(ingest.Config{OnResync: reg.onResync}, ix, pods)
	if err != nil {
		t.Fatal(err)
	}
	reg.attach(sub)
	ctx, cancel := context.WithCancel(context.Background())
	if err := sub.Start(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		reg.run(ctx)
	}()
	hs := httptest.NewServer(reg)
	var once sync.Once
	stop := func() {
		once.Do(func() {
			hs.Close()
			cancel()
			<-done
			sub.Close()
			rdb.Close()
		})
	}
	t.Cleanup(stop)
	return &sharedReplica{reg: reg, url: hs.URL, stop: stop}
}

// fakeDaemon is a daemon's cluster side over a real chunk stream and a
// real member, with its chunks in a map instead of tiers.
type fakeDaemon struct {
	stream *member.Stream
	mu     sync.Mutex
	chunks map[chunk.Key]string // key → tier ("mem", "disk")
	stop   func()
}

func startFakeDaemon(t *testing.T, instance string, controllers []string, interval time.Duration) *fakeDaemon {
	t.Helper()
	stream, err := member.NewStream("tcp://127.0.0.1:0", instance, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := &fakeDaemon{stream: stream, chunks: map[chunk.Key]string{}}
	var m *member.Member
	admin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/api/v1/cluster/resync" {
			m.StartResync()
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	m = member.New(member.Options{Controllers: controllers, Interval: interval, Stream: stream, Lister: d,
		Register: cluster.Register{Instance: instance, Addr: "127.0.0.1:9", Events: "tcp://" + stream.Addr(), Admin: admin.URL}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Run(ctx)
	}()
	var once sync.Once
	d.stop = func() {
		once.Do(func() {
			cancel()
			<-done // deregistered
			admin.Close()
			stream.Close()
		})
	}
	t.Cleanup(d.stop)
	return d
}

// ListChunks implements member.Lister.
func (d *fakeDaemon) ListChunks(_ []uint64, fn func(tier string, key chunk.Key, size int) bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, tier := range d.chunks {
		if !fn(tier, k, 1) {
			return
		}
	}
}

// admit stores a chunk, reporting it as a tier would, under the lock the
// listing takes.
func (d *fakeDaemon) admit(tier string, k chunk.Key) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.chunks[k] = tier
	d.stream.Admitted(tier, k)
}

func testKey(i int) chunk.Key {
	var h chunk.Hash
	for j := range h {
		h[j] = byte(i*31 + j*7)
	}
	return chunk.Key{Hash: h}
}

// holdersAt renders what a replica's lookup says of keys, "instance/tier"
// per holding, sorted, one string per key.
func holdersAt(t *testing.T, url string, keys ...chunk.Key) []string {
	t.Helper()
	ids := make([]uint64, len(keys))
	for i, k := range keys {
		ids[i] = k.Index()
	}
	hs, err := cluster.NewClient(url, nil).Lookup(context.Background(), ids)
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	out := make([]string, len(hs))
	for i, h := range hs {
		var s []string
		for _, x := range h {
			s = append(s, x.Instance+"/"+x.Tier)
		}
		slices.Sort(s)
		out[i] = strings.Join(s, ",")
	}
	return out
}

// listed renders a replica's instances as "instance session registered".
func listed(t *testing.T, r *sharedReplica) string {
	t.Helper()
	out, err := r.reg.instances()
	if err != nil {
		return "error: " + err.Error()
	}
	var s []string
	for _, in := range out {
		s = append(s, in.Instance+" "+in.Session+" "+in.Registered)
	}
	return strings.Join(s, "; ")
}

func waitEqual(t *testing.T, what string, got func() string, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second) // a hang bound, not a measurement
	for {
		g := got()
		if g == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: got %q, want %q", what, g, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSharedRegistryReplicas runs two replicas on one Redis and a daemon
// whose member knows both: they list it alike, answer its lookups alike,
// its beats go on through the survivor when one stops, a replica started
// afresh answers the same, and its deregistration clears it everywhere.
func TestSharedRegistryReplicas(t *testing.T) {
	srv := redistest.Start(t)
	// Ten missed beats, so that a loaded machine never drops d1 while
	// the test counts on it beating.
	const beat, missed = 100 * time.Millisecond, 10
	a, b := startSharedReplicaMissed(t, srv, beat, missed), startSharedReplicaMissed(t, srv, beat, missed)
	d := startFakeDaemon(t, "d1", []string{a.url, b.url}, beat)

	waitEqual(t, "d1 registered on both", func() string {
		la, lb := listed(t, a), listed(t, b)
		if la == "" || la != lb {
			return la + " | " + lb
		}
		return "same"
	}, "same")
	d.admit("mem", testKey(1))
	d.admit("disk", testKey(2))
	for _, r := range []*sharedReplica{a, b} {
		waitEqual(t, "lookup at "+r.url, func() string {
			return strings.Join(holdersAt(t, r.url, testKey(1), testKey(2), testKey(3)), " | ")
		}, "d1/cpu | d1/disk | ")
	}
	session := strings.Fields(listed(t, b))[1]

	// A stops: b still answers, d1 beats through b, and chunks stored
	// now reach the index through b's subscription.
	a.stop()
	d.admit("mem", testKey(3))
	waitEqual(t, "chunk stored after a stopped", func() string {
		return strings.Join(holdersAt(t, b.url, testKey(1), testKey(2), testKey(3)), " | ")
	}, "d1/cpu | d1/disk | d1/cpu")
	before, _ := b.reg.instances()
	time.Sleep((missed + 2) * beat) // longer than the missed beats that would drop d1
	after, _ := b.reg.instances()
	if len(after) != 1 || after[0].Session != session || after[0].LastBeat <= before[0].LastBeat {
		t.Fatalf("d1 after a stopped: %+v (before %+v), want the same session still beating", after, before)
	}

	// A replica started afresh follows d1 and answers the same.
	a2 := startSharedReplicaMissed(t, srv, beat, missed)
	waitEqual(t, "the new replica's listing", func() string { return listed(t, a2) }, listed(t, b))
	waitEqual(t, "the new replica's lookup", func() string {
		return strings.Join(holdersAt(t, a2.url, testKey(1), testKey(2), testKey(3)), " | ")
	}, "d1/cpu | d1/disk | d1/cpu")

	// Deregistration (through whichever replica) clears it everywhere.
	d.stop()
	for _, r := range []*sharedReplica{a2, b} {
		waitEqual(t, "d1 gone at "+r.url, func() string {
			return listed(t, r) + strings.Join(holdersAt(t, r.url, testKey(1), testKey(2), testKey(3)), "|")
		}, "||")
	}
}

// TestSharedRegistryDropsSilentDaemon: a daemon that registered and went
// silent is dropped by one of the replicas, its entries with it, and its
// session is unknown to both.
func TestSharedRegistryDropsSilentDaemon(t *testing.T) {
	srv := redistest.Start(t)
	const beat = 50 * time.Millisecond
	a, b := startSharedReplica(t, srv, beat), startSharedReplica(t, srv, beat)
	stream, err := member.NewStream("tcp://127.0.0.1:0", "d2", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	c := cluster.NewClient(a.url, nil)
	ctx := context.Background()
	got, err := c.Register(ctx, cluster.Register{Instance: "d2", Addr: "127.0.0.1:9", Events: "tcp://" + stream.Addr(), Admin: "http://127.0.0.1:9"})
	if err != nil {
		t.Fatal(err)
	}
	// d2 beats until both replicas have its chunk: three missed beats of
	// 50 ms drop it, and a loaded machine can take longer than that to
	// subscribe, which would drop d2 before there is anything to test.
	alive := func() {
		if err := c.Heartbeat(ctx, "d2", got.Session); err != nil {
			t.Fatalf("d2's heartbeat: %v", err)
		}
	}
	// Entries as d2's stream would write them, through b's followed stream.
	waitEqual(t, "b follows d2", func() string {
		alive()
		stream.Keepalive()
		return fmt.Sprint(b.reg.sub.Stats()[cluster.HolderPrefix+"d2"].Messages > 0)
	}, "true")
	stream.Admitted("mem", testKey(5))
	waitEqual(t, "d2's chunk", func() string {
		alive()
		return strings.Join(holdersAt(t, a.url, testKey(5)), "")
	}, "d2/cpu")
	// Silent now: dropped within a few beats, by one replica.
	for _, r := range []*sharedReplica{a, b} {
		waitEqual(t, "d2 dropped at "+r.url, func() string {
			return listed(t, r) + strings.Join(holdersAt(t, r.url, testKey(5)), "")
		}, "")
		if err := cluster.NewClient(r.url, nil).Heartbeat(ctx, "d2", got.Session); err == nil {
			t.Errorf("%s accepted a dropped session's beat", r.url)
		}
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer rdb.Close()
	if n, err := rdb.Exists(ctx, sharedPrefix+"d:d2").Result(); err != nil || n != 0 {
		t.Errorf("d2's record after the drop: %d, %v", n, err)
	}
	if n, err := rdb.ZCard(ctx, sharedPrefix+"clearing").Result(); err != nil || n != 0 {
		t.Errorf("clears pending after the drop: %d, %v", n, err)
	}
}

// TestSharedReapDropsOnce runs the reap script from two clients at once
// over many late daemons: each is handed to exactly one of them.
func TestSharedReapDropsOnce(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	clients := []*goredis.Client{goredis.NewClient(&goredis.Options{Addr: srv.Addr}), goredis.NewClient(&goredis.Options{Addr: srv.Addr})}
	defer clients[0].Close()
	defer clients[1].Close()
	r := newSharedRegistry(clients[0], nil, nil, time.Second, 3, slog.New(slog.DiscardHandler))
	const n = 500
	for i := range n {
		inst := fmt.Sprintf("d%d", i)
		if err := registerScript.Run(ctx, clients[0], []string{r.beats, r.clearing, r.record(inst)}, inst, `{}`, "s", r.channel).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Every beat an hour old.
	members, err := clients[0].ZRange(ctx, r.beats, 0, -1).Result()
	if err != nil || len(members) != n {
		t.Fatalf("%d registered, %v", len(members), err)
	}
	old := float64(time.Now().Add(-time.Hour).UnixMilli())
	for _, m := range members {
		if err := clients[0].ZAdd(ctx, r.beats, goredis.Z{Score: old, Member: m}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				got, err := reapScript.Run(ctx, c, []string{r.beats, r.clearing}, sharedPrefix+"d:",
					3000, clearLease.Milliseconds(), r.channel, 37).StringSlice()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, inst := range got {
					seen[inst]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(seen) != n {
		t.Fatalf("%d daemons dropped, want %d", len(seen), n)
	}
	for inst, k := range seen {
		if k != 1 {
			t.Fatalf("%s handed out %d times", inst, k)
		}
	}
	// Registering again waits for the clear.
	if res, err := registerScript.Run(ctx, clients[1], []string{r.beats, r.clearing, r.record("d3")}, "d3", `{}`, "s2", r.channel).StringSlice(); err != nil || res[0] != "busy" {
		t.Fatalf("registering while clearing: %q, %v", res, err)
	}
}

// TestSharedRegistryErrors: bad bodies are 400 as in memory, and with
// Redis gone every registry call is a clear 503, never a hang or panic.
func TestSharedRegistryErrors(t *testing.T) {
	srv := redistest.Start(t)
	a := startSharedReplica(t, srv, time.Second)
	for _, tc := range []struct{ path, body, want string }{
		{"register", `{"instance":"a"`, "400"},
		{"register", `{"instance":"a@b","addr":"h:1","events":"tcp://h:2","admin":"http://h:3"}`, "400"},
		{"heartbeat", `{"instance":"a","session":"x"}`, "404"},
		{"heartbeat", `{"instance":"a","session":""}`, "404"},
		{"deregister", `{"instance":"a","session":"x"}`, "404"},
		{"lookup", `{"keys":["xyz"]}`, "400"},
	} {
		if status, body := post(t, a.url+"/v1/cluster/"+tc.path, tc.body); fmt.Sprint(status) != tc.want {
			t.Errorf("%s %s: %d %s, want %s", tc.path, tc.body, status, body, tc.want)
		}
	}
	srv.Stop()
	for _, path := range []string{"register", "heartbeat", "deregister"} {
		status, body := post(t, a.url+"/v1/cluster/"+path, `{"instance":"a","addr":"h:1","events":"tcp://h:2","admin":"http://h:3"}`)
		if path != "register" {
			status, body = post(t, a.url+"/v1/cluster/"+path, `{"instance":"a","session":"x"}`)
		}
		if status != http.StatusServiceUnavailable || !strings.Contains(body, "Redis") {
			t.Errorf("%s with Redis down: %d %s", path, status, body)
		}
	}
	resp, err := http.Get(a.url + "/v1/cluster/instances")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("instances with Redis down: %d", resp.StatusCode)
	}
	if got := holdersAt(t, a.url, testKey(1)); len(got) != 1 || got[0] != "" {
		t.Errorf("lookup with Redis down: %q, want no holders", got)
	}
}

// TestSharedRegistryChunkSize: a replica refuses a daemon whose chunk size
// differs from one registered through another replica, and both cut token
// lookups with the registered size.
func TestSharedRegistryChunkSize(t *testing.T) {
	srv := redistest.Start(t)
	a, b := startSharedReplica(t, srv, time.Second), startSharedReplica(t, srv, time.Second)
	reg := cluster.Register{Instance: "d1", Addr: "127.0.0.1:9", Events: "tcp://127.0.0.1:9", Admin: "http://127.0.0.1:9", ChunkSize: 256}
	if _, err := a.reg.register(reg); err != nil {
		t.Fatal(err)
	}
	other := reg
	other.Instance, other.ChunkSize = "d2", 128
	if _, err := b.reg.register(other); !errors.Is(err, errChunkSizeMix) {
		t.Fatalf("d2 with chunk_size 128 beside d1's 256: err %v, want errChunkSizeMix", err)
	}
	other.ChunkSize = 256
	if _, err := b.reg.register(other); err != nil {
		t.Fatalf("d2 with the same chunk size: %v", err)
	}
	for _, r := range []*sharedReplica{a, b} {
		waitEqual(t, "chunk size at "+r.url, func() string {
			return strconv.Itoa(int(r.reg.look.chunkSize.Load()))
		}, "256")
	}
}
