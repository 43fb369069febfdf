package tier_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/internal/redistest"
	"kvtier/tier"
	"kvtier/tier/redis"
	"kvtier/tier/remote"
)

// redisSaveFixture is saveFixture with a Redis tier (a real redis-server,
// stacked as the engine stacks it) below the disk tier.
func redisSaveFixture(t *testing.T, n int, timeout time.Duration) (*tier.Manager, *loggedWrites, *remote.Encoded, *redistest.Server, []chunk.Key, []arena.ID, [][]byte) {
	t.Helper()
	srv := redistest.Start(t)
	rt, err := remote.Open(context.Background(), srv.URL(), remote.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	g := remote.Guard(rt, remote.GuardOptions{Timeout: timeout, Threshold: 1, ProbeInterval: 50 * time.Millisecond})
	e := remote.Encode(g, "redis", nil, nil)
	d := &loggedWrites{Tier: newDisk(t, t.TempDir(), 64<<20), ranges: map[chunk.Key][][2]int{}}
	m, err := tier.NewManager(newRAM(t, 64*geoChunk), []tier.Tier{d, e}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	var keys []chunk.Key
	var ids []arena.ID
	var chunks [][]byte
	for i := range n {
		id, _, err := m.Reserve(geoChunk)
		if err != nil {
			t.Fatal(err)
		}
		keys, ids, chunks = append(keys, key(i)), append(ids, id), append(chunks, payload(i, geoChunk))
	}
	return m, d, e, srv, keys, ids, chunks
}

func rawRedis(t *testing.T, srv *redistest.Server) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, DisableIdentity: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// stagingKeys counts the staging keys in the server.
func stagingKeys(t *testing.T, c *goredis.Client) int {
	t.Helper()
	keys, err := c.Keys(context.Background(), "{*}:stage:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}

// layerBytes is how many layer bytes the save gave the lower tier i.
func layerBytes(m *tier.Manager, i int) uint64 {
	_, qs := m.Stats()
	return qs[i].LayerBytes
}

// TestLayerSaveToDiskAndRedis: a save writes every layer to the disk tier
// and to Redis before the commit, neither showing an object until then;
// after it both hold the filled bytes, both count the chunks as saved by
// layers, and no staging key or pinned byte is left. An aborted save
// leaves nothing in either.
func TestLayerSaveToDiskAndRedis(t *testing.T) {
	m, d, e, srv, keys, ids, chunks := redisSaveFixture(t, 3, 10*time.Second)
	raw := rawRedis(t, srv)
	s := m.BeginLayerSave(keys, ids, testGeo)
	t.Cleanup(s.Abort)
	for layer := range testGeo.Layers {
		fillLayer(m, ids, chunks, layer)
		s.Layer(layer)
		want := uint64((layer + 1) * geoChunk / testGeo.Layers * len(keys))
		waitUntil(t, "layer given to both tiers", func() bool { return layerBytes(m, 0) == want && layerBytes(m, 1) == want })
		if d.Contains(keys[0]) || e.Contains(keys[0]) {
			t.Fatalf("layer %d: an object is visible before the commit", layer)
		}
	}
	if n := stagingKeys(t, raw); n != len(keys) {
		t.Fatalf("%d staging keys for %d chunks", n, len(keys))
	}
	if err := m.CommitRunSaved(keys, ids, s); err != nil {
		t.Fatal(err)
	}
	if err := m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	for c, k := range keys {
		for _, lt := range []tier.Tier{d, e} {
			got := make([]byte, geoChunk)
			if n, err := lt.Get(context.Background(), k, got); err != nil || n != geoChunk || !bytes.Equal(got, chunks[c]) {
				t.Fatalf("chunk %d in %s: %d bytes, %v", c, lt.Name(), n, err)
			}
		}
	}
	_, qs := m.Stats()
	if qs[0].LayerSaved != 3 || qs[1].LayerSaved != 3 || qs[1].Failed != 0 {
		t.Fatalf("queues after the save: %+v", qs)
	}
	if n := stagingKeys(t, raw); n != 0 {
		t.Fatalf("%d staging keys left", n)
	}
	if st := m.RAM().Arena().Stats(); st.Pinned != 0 {
		t.Fatalf("%d bytes still pinned after the save", st.Pinned)
	}

	// An aborted save.
	var ids2 []arena.ID
	keys2 := []chunk.Key{key(10), key(11)}
	for range keys2 {
		id, _, err := m.Reserve(geoChunk)
		if err != nil {
			t.Fatal(err)
		}
		ids2 = append(ids2, id)
	}
	s2 := m.BeginLayerSave(keys2, ids2, testGeo)
	for layer := range 3 {
		fillLayer(m, ids2, chunks[:2], layer)
		s2.Layer(layer)
	}
	want := layerBytes(m, 1) + uint64(3*geoChunk/testGeo.Layers*len(keys2))
	waitUntil(t, "three layers in Redis", func() bool { return layerBytes(m, 1) == want })
	s2.Abort()
	for _, id := range ids2 {
		m.RAM().Arena().Unref(id)
	}
	waitUntil(t, "staging keys dropped", func() bool { return stagingKeys(t, raw) == 0 })
	for _, k := range keys2 {
		if e.Contains(k) || d.Contains(k) {
			t.Fatalf("%v stored after an abort", k)
		}
	}
}

// TestLayerSaveRedisHangs: Redis stops answering (SIGSTOP) mid-save. The
// disk tier's range writes go on meanwhile; Redis's fail at the breaker's
// deadline and the commit's whole write fails too, counted missing, never
// half an object; once Redis answers again, Sync writes the chunks whole
// with the bytes in RAM.
func TestLayerSaveRedisHangs(t *testing.T) {
	m, d, e, srv, keys, ids, chunks := redisSaveFixture(t, 2, 300*time.Millisecond)
	s := m.BeginLayerSave(keys, ids, testGeo)
	t.Cleanup(s.Abort)
	fillLayer(m, ids, chunks, 0)
	s.Layer(0)
	one := uint64(geoChunk / testGeo.Layers * len(keys))
	waitUntil(t, "layer 0 in both tiers", func() bool { return layerBytes(m, 0) == one && layerBytes(m, 1) == one })
	if err := srv.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			srv.Signal(syscall.SIGCONT)
		}
	}()
	for layer := 1; layer < testGeo.Layers; layer++ {
		fillLayer(m, ids, chunks, layer)
		s.Layer(layer)
		want := uint64(layer+1) * one
		waitUntil(t, "disk keeps up while Redis hangs", func() bool { return layerBytes(m, 0) == want })
	}
	if err := m.CommitRunSaved(keys, ids, s); err != nil {
		t.Fatal(err)
	}
	// Redis, stopped, lacks the chunks: Flush returns and says so.
	if err := m.Flush(context.Background()); !errors.Is(err, tier.ErrNotDurable) {
		t.Fatalf("Flush while Redis hangs = %v, want ErrNotDurable", err)
	}
	srv.Signal(syscall.SIGCONT)
	stopped = false
	if _, qs := m.Stats(); qs[0].LayerSaved != 2 || qs[1].LayerSaved != 0 {
		t.Fatalf("queues: %+v", qs)
	}
	waitUntil(t, "Redis back", func() bool {
		rep, err := m.Sync(context.Background())
		return err == nil && rep[1].Missing == 0
	})
	for c, k := range keys {
		for _, lt := range []tier.Tier{d, e} {
			got := make([]byte, geoChunk)
			if n, err := lt.Get(context.Background(), k, got); err != nil || n != geoChunk || !bytes.Equal(got, chunks[c]) {
				t.Fatalf("chunk %d in %s: %d bytes, %v", c, lt.Name(), n, err)
			}
		}
	}
}

var _ = redis.StageTTL // the Redis scheme is registered by this import

// abortOnOpen is a Redis tier whose first OpenWrite aborts the save that
// called it (as a lease expiring or a connection closing would, while
// the save is opening its chunks), then opens as usual.
type abortOnOpen struct {
	*remote.Encoded
	save  atomic.Pointer[tier.LayerSave]
	calls atomic.Int32
}

func (a *abortOnOpen) OpenWrite(ctx context.Context, k chunk.Key, size int) (tier.RangeWrite, error) {
	if a.calls.Add(1) == 1 {
		a.save.Load().Abort()
	}
	return a.Encoded.OpenWrite(ctx, k, size)
}

// TestLayerSaveAbortWhileOpening: a save of sixteen chunks aborted as it
// opens its first staging key opens no more than the opens already under
// way (at most eight at a time), so Redis sees at most eight staging
// keys created (SET), and the save drops every one of them: Redis holds
// no key afterwards.
func TestLayerSaveAbortWhileOpening(t *testing.T) {
	srv := redistest.Start(t)
	rt, err := remote.Open(context.Background(), srv.URL(), remote.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	g := remote.Guard(rt, remote.GuardOptions{Timeout: 10 * time.Second})
	a := &abortOnOpen{Encoded: remote.Encode(g, "redis", nil, nil)}
	m, err := tier.NewManager(newRAM(t, 64*geoChunk), []tier.Tier{a}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	raw := rawRedis(t, srv)
	var keys []chunk.Key
	var ids []arena.ID
	var chunks [][]byte
	for i := range 16 {
		id, _, err := m.Reserve(geoChunk)
		if err != nil {
			t.Fatal(err)
		}
		keys, ids, chunks = append(keys, key(i)), append(ids, id), append(chunks, payload(i, geoChunk))
	}
	sets := setCalls(t, raw)
	s := m.BeginLayerSave(keys, ids, testGeo)
	if s == nil {
		t.Fatal("no save: Redis takes no range writes")
	}
	a.save.Store(s)
	fillLayer(m, ids, chunks, 0)
	s.Layer(0)
	waitUntil(t, "the first OpenWrite", func() bool { return a.calls.Load() > 0 })
	m.Close() // waits for the save's goroutine: the opens, then the aborts
	if n := a.calls.Load(); n > 8 {
		t.Fatalf("%d OpenWrites after an abort during the first of 16", n)
	}
	if n := setCalls(t, raw) - sets; n > 8 {
		t.Fatalf("%d staging keys created for an aborted save of 16 chunks", n)
	}
	waitUntil(t, "staging keys dropped", func() bool { return stagingKeys(t, raw) == 0 })
	if n, err := raw.DBSize(context.Background()).Result(); err != nil || n != 0 {
		t.Fatalf("%d keys in Redis after an aborted save (%v)", n, err)
	}
}

// setCalls is how many SETs the server has run (INFO commandstats).
func setCalls(t *testing.T, c *goredis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_set:calls="); ok {
			n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// TestLayerSaveRedisStoredFirst: a chunk another writer stored in Redis
// while a save was writing it by layers is not counted as saved by
// layers there (the publish found the object and dropped the staged
// copy); the other chunk is, and both read back the filled bytes.
func TestLayerSaveRedisStoredFirst(t *testing.T) {
	m, _, e, srv, keys, ids, chunks := redisSaveFixture(t, 2, 10*time.Second)
	raw := rawRedis(t, srv)
	s := m.BeginLayerSave(keys, ids, testGeo)
	t.Cleanup(s.Abort)
	for layer := range testGeo.Layers {
		fillLayer(m, ids, chunks, layer)
		s.Layer(layer)
	}
	want := uint64(geoChunk * len(keys))
	waitUntil(t, "every layer given to Redis", func() bool { return layerBytes(m, 1) == want })
	if err := e.Put(context.Background(), keys[0], chunks[0]); err != nil {
		t.Fatal(err)
	}
	if err := m.CommitRunSaved(keys, ids, s); err != nil {
		t.Fatal(err)
	}
	if err := m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	for c, k := range keys {
		got := make([]byte, geoChunk)
		if n, err := e.Get(context.Background(), k, got); err != nil || n != geoChunk || !bytes.Equal(got, chunks[c]) {
			t.Fatalf("chunk %d in Redis: %d bytes, %v", c, n, err)
		}
	}
	if _, qs := m.Stats(); qs[0].LayerSaved != 2 || qs[1].LayerSaved != 1 || qs[1].Failed != 0 {
		t.Fatalf("queues after the save: %+v", qs)
	}
	if n := stagingKeys(t, raw); n != 0 {
		t.Fatalf("%d staging keys left", n)
	}
}

// TestLayerSaveRedisRefusesPublish: a healthy Redis that refuses the
// publish script (EVAL renamed away). A save of eight chunks stages them,
// its commit's eight publishes are refused in parallel, and the breaker
// (threshold 5) counts none of it: it stays closed, nothing fails fast,
// the chunks are written whole and read back byte-exact, and no staging
// key is left. The next save writes Redis whole chunks (it is no range
// writer any more) and they read back too.
func TestLayerSaveRedisRefusesPublish(t *testing.T) {
	srv := redistest.StartWith(t, "--rename-command", "EVAL", "")
	rt, err := remote.Open(context.Background(), srv.URL(), remote.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	g := remote.Guard(rt, remote.GuardOptions{Timeout: 10 * time.Second, Threshold: 5, ProbeInterval: time.Hour})
	e := remote.Encode(g, "redis", nil, nil)
	m, err := tier.NewManager(newRAM(t, 64*geoChunk), []tier.Tier{e}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	raw := rawRedis(t, srv)
	save := func(first int, ranges bool) {
		t.Helper()
		var keys []chunk.Key
		var ids []arena.ID
		var chunks [][]byte
		for i := first; i < first+8; i++ {
			id, _, err := m.Reserve(geoChunk)
			if err != nil {
				t.Fatal(err)
			}
			keys, ids, chunks = append(keys, key(i)), append(ids, id), append(chunks, payload(i, geoChunk))
		}
		s := m.BeginLayerSave(keys, ids, testGeo)
		if (s != nil) != ranges {
			t.Fatalf("chunks %d..: a save by ranges %v, want %v", first, s != nil, ranges)
		}
		for layer := range testGeo.Layers {
			fillLayer(m, ids, chunks, layer)
			if s != nil {
				s.Layer(layer)
			}
		}
		if err := m.CommitRunSaved(keys, ids, s); err != nil {
			t.Fatal(err)
		}
		if err := m.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		for c, k := range keys {
			got := make([]byte, geoChunk)
			if n, err := e.Get(context.Background(), k, got); err != nil || n != geoChunk || !bytes.Equal(got, chunks[c]) {
				t.Fatalf("chunk %d in Redis: %d bytes, %v", first+c, n, err)
			}
		}
	}
	save(0, true)
	save(20, false)
	if h := g.Health(); h.State != remote.StateClosed || h.Failures != 0 || h.FastFails != 0 || h.Opens != 0 {
		t.Fatalf("breaker: %+v", h)
	}
	if _, qs := m.Stats(); qs[0].Failed != 0 || qs[0].LayerSaved != 0 {
		t.Fatalf("queue: %+v", qs[0])
	}
	if n := stagingKeys(t, raw); n != 0 {
		t.Fatalf("%d staging keys left", n)
	}
}
