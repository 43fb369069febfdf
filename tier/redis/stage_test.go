package redis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/chunk"
	"kvtier/codec"
	"kvtier/kvformat"
	"kvtier/tier"
	"kvtier/tier/remote"
)

// stageChunk is a chunk of 74 pieces of 4 KiB, the last one short; its
// "layers" (stageSpan bytes in each of two parts) straddle pieces.
const (
	stageChunk  = 300000
	stageLayers = 6
	stageSpan   = stageChunk / 2 / stageLayers
)

// stageStack is the tier stacked as the engine stacks it: envelope over
// breaker over Redis.
func stageStack(t *testing.T, rawURL string, o remote.GuardOptions) (*Tier, *remote.Guarded, *remote.Encoded) {
	t.Helper()
	rt := openTier(t, rawURL)
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	g := remote.Guard(rt, o)
	t.Cleanup(func() { g.Close() })
	return rt, g, remote.Encode(g, "redis", nil, nil)
}

// ownServer starts a redis-server of the test's own with extra options
// and waits until it answers.
func ownServer(t *testing.T, extra ...string) *server {
	t.Helper()
	srv := startServer(t, extra...)
	srv.waitReady()
	return srv
}

// strictBreaker is a breaker that a handful of failures would open (and
// no probe would close again), so that a test sees any failure it counts.
var strictBreaker = remote.GuardOptions{Threshold: 5, ProbeInterval: time.Hour}

// stageChunks returns n keys of one new scope and a chunk for each, the
// chunks' contents from seed on.
func stageChunks(n int, seed uint64) ([]chunk.Key, [][]byte) {
	scope := uniqueScope()
	keys, chunks := make([]chunk.Key, n), make([][]byte, n)
	for i := range n {
		keys[i], chunks[i] = testKey(scope, i), payload(stageChunk, seed+uint64(i))
	}
	return keys, chunks
}

// writeAllLayers writes every layer of src through w, then commits it.
func writeAllLayers(t *testing.T, w tier.RangeWrite, src []byte) error {
	t.Helper()
	for l := range stageLayers {
		if err := writeLayer(t, w, src, l); err != nil {
			return err
		}
	}
	return w.Commit(context.Background(), src, chunk.Key{}, false)
}

// writeLayer writes "layer" l of src (its span in each of the two halves)
// through w.
func writeLayer(t *testing.T, w tier.RangeWrite, src []byte, l int) error {
	t.Helper()
	for part := range 2 {
		from := part*stageChunk/2 + l*stageSpan
		if err := w.WriteRange(context.Background(), src, from, from+stageSpan); err != nil {
			return err
		}
	}
	return nil
}

// stagingKeys lists the staging keys of k's object.
func stagingKeys(t *testing.T, c *goredis.Client, rt *Tier, k chunk.Key) []string {
	t.Helper()
	pattern := "{" + rt.keyName(k) + "}:stage:*"
	keys, err := c.Keys(context.Background(), pattern).Result()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestStagedWriteIsInvisibleUntilCommit writes a raw chunk a layer at a
// time: before the commit its key does not exist (nor does Size or a
// range read find it), while its staging key holds each finished piece
// and expires on its own; after the commit the stored object is byte for
// byte what Put stores, reads back whole and by range, has no TTL, and the
// staging key is gone.
func TestStagedWriteIsInvisibleUntilCommit(t *testing.T) {
	srv := sharedServer(t)
	rt, _, e := stageStack(t, srv.url(""), remote.GuardOptions{})
	raw := srv.rawClient()
	ctx := context.Background()
	src := payload(stageChunk, 31)
	k := testKey(92, 1)
	if !e.WritesRanges() {
		t.Fatal("a raw Redis tier does not write ranges")
	}
	w, err := e.OpenWrite(ctx, k, len(src))
	if err != nil || w == nil {
		t.Fatalf("OpenWrite: %v, %v", w, err)
	}
	for l := range 3 {
		if err := writeLayer(t, w, src, l); err != nil {
			t.Fatal(err)
		}
		if n, _ := raw.Exists(ctx, rt.keyName(k)).Result(); n != 0 {
			t.Fatalf("layer %d: the object is visible before the commit", l)
		}
		if _, ok := e.Size(k); ok {
			t.Fatalf("layer %d: Size finds the object before the commit", l)
		}
	}
	stages := stagingKeys(t, raw, rt, k)
	if len(stages) != 1 {
		t.Fatalf("staging keys %v", stages)
	}
	if ttl, _ := raw.PTTL(ctx, stages[0]).Result(); ttl <= 0 || ttl > StageTTL {
		t.Fatalf("staging key TTL %v", ttl)
	}
	// The pieces layers 0..2 completed in the first half are in the
	// staging key already: 3 spans of 25000 bytes cover 18 whole pieces.
	got, _ := raw.GetRange(ctx, stages[0], codec.PiecedHeaderSize, codec.PiecedHeaderSize+18*4096-1).Bytes()
	if !bytes.Equal(got, src[:18*4096]) {
		t.Fatal("finished pieces are not in the staging key before the commit")
	}
	for l := 3; l < stageLayers; l++ {
		if err := writeLayer(t, w, src, l); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(ctx, src, chunk.Key{}, false); err != nil {
		t.Fatal(err)
	}
	if r, ok := w.(remote.FoundStoredReporter); !ok || r.FoundStored() {
		t.Fatal("a commit that published says it found the object stored")
	}
	want, err := codec.SealPieced(nil, kvformat.Spec{}, src)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := raw.Get(ctx, rt.keyName(k)).Bytes()
	if err != nil || !bytes.Equal(stored, want) {
		t.Fatalf("stored object differs from Put's (%d bytes, %v)", len(stored), err)
	}
	if ttl, _ := raw.PTTL(ctx, rt.keyName(k)).Result(); ttl != -1 {
		t.Fatalf("object TTL %v, want none", ttl)
	}
	if s := stagingKeys(t, raw, rt, k); len(s) != 0 {
		t.Fatalf("staging keys left: %v", s)
	}
	whole := make([]byte, len(src))
	if n, err := e.Get(ctx, k, whole); err != nil || n != len(src) || !bytes.Equal(whole, src) {
		t.Fatalf("whole read: %d, %v", n, err)
	}
	dst := make([]byte, len(src))
	rr, err := e.OpenRange(ctx, k, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer rr.Close()
	for _, rg := range [][2]int{{0, stageSpan}, {stageChunk / 2, stageChunk/2 + stageSpan}, {stageChunk - 10, stageChunk}} {
		if err := rr.ReadRange(ctx, rg[0], rg[1]); err != nil || !bytes.Equal(dst[rg[0]:rg[1]], src[rg[0]:rg[1]]) {
			t.Fatalf("range %v: %v", rg, err)
		}
	}
}

// TestStagedWriteAbortAndLoss: an abort drops the staging key and leaves
// nothing visible; a staging key lost mid-write (deleted here, as an
// expiry or an eviction would) is never published, even when the last
// write recreates it at its full length, and the commit fails; an object
// stored meanwhile by another writer wins, and the staging key is dropped.
func TestStagedWriteAbortAndLoss(t *testing.T) {
	srv := sharedServer(t)
	rt, _, e := stageStack(t, srv.url(""), remote.GuardOptions{})
	raw := srv.rawClient()
	ctx := context.Background()
	src := payload(stageChunk, 32)

	k := testKey(93, 1)
	w, err := e.OpenWrite(ctx, k, len(src))
	if err != nil || w == nil {
		t.Fatal(w, err)
	}
	if err := writeLayer(t, w, src, 0); err != nil {
		t.Fatal(err)
	}
	w.Abort()
	if s := stagingKeys(t, raw, rt, k); len(s) != 0 {
		t.Fatalf("abort left %v", s)
	}
	if n, _ := raw.Exists(ctx, rt.keyName(k)).Result(); n != 0 {
		t.Fatal("an aborted object is visible")
	}

	// Lost before the last piece: that write makes a key of the full
	// length again, but without the marker.
	k = testKey(93, 2)
	if w, err = e.OpenWrite(ctx, k, len(src)); err != nil || w == nil {
		t.Fatal(w, err)
	}
	if err := w.WriteRange(ctx, src, 0, stageChunk-100); err != nil {
		t.Fatal(err)
	}
	if err := raw.Del(ctx, stagingKeys(t, raw, rt, k)...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(ctx, src, chunk.Key{}, false); !errors.Is(err, remote.ErrStageLost) {
		t.Fatalf("commit of a lost staging key: %v", err)
	}
	if n, _ := raw.Exists(ctx, rt.keyName(k)).Result(); n != 0 {
		t.Fatal("a lost staging key was published")
	}
	if s := stagingKeys(t, raw, rt, k); len(s) != 0 {
		t.Fatalf("lost staging key left: %v", s)
	}

	// Lost early: the next write sees a short key.
	k = testKey(93, 3)
	if w, err = e.OpenWrite(ctx, k, len(src)); err != nil || w == nil {
		t.Fatal(w, err)
	}
	raw.Del(ctx, stagingKeys(t, raw, rt, k)...)
	if err := writeLayer(t, w, src, 0); !errors.Is(err, remote.ErrStageLost) {
		t.Fatalf("write after the loss: %v", err)
	}
	w.Abort()
	for _, s := range stagingKeys(t, raw, rt, k) {
		if ttl, _ := raw.PTTL(ctx, s).Result(); ttl <= 0 {
			t.Fatalf("recreated staging key %s without a TTL (%v)", s, ttl)
		}
	}

	// Stored by another writer before the commit.
	k = testKey(93, 4)
	if w, err = e.OpenWrite(ctx, k, len(src)); err != nil || w == nil {
		t.Fatal(w, err)
	}
	if err := w.WriteRange(ctx, src, 0, stageChunk); err != nil {
		t.Fatal(err)
	}
	if err := e.Put(ctx, k, src); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(ctx, src, chunk.Key{}, false); err != nil {
		t.Fatal(err)
	}
	if r, ok := w.(remote.FoundStoredReporter); !ok || !r.FoundStored() {
		t.Fatal("a commit that found the object stored does not say so")
	}
	if s := stagingKeys(t, raw, rt, k); len(s) != 0 {
		t.Fatalf("staging key left beside a stored object: %v", s)
	}
	whole := make([]byte, len(src))
	if n, err := e.Get(ctx, k, whole); err != nil || n != len(src) || !bytes.Equal(whole, src) {
		t.Fatalf("object stored twice: %d, %v", n, err)
	}
	if w, _ := e.OpenWrite(ctx, k, len(src)); w != nil {
		t.Fatal("a writer for a stored key")
	}
}

// TestStagedWriteTTLAndCodecs: with ttl= the published object expires as
// Put's would; a tier sealing with another codec than raw, or told
// layer_saves=false, writes no ranges; layer_saves takes booleans only.
func TestStagedWriteTTLAndCodecs(t *testing.T) {
	srv := sharedServer(t)
	rt, _, e := stageStack(t, srv.url("ttl=1h"), remote.GuardOptions{})
	raw := srv.rawClient()
	ctx := context.Background()
	src := payload(stageChunk, 33)
	k := testKey(94, 1)
	w, err := e.OpenWrite(ctx, k, len(src))
	if err != nil || w == nil {
		t.Fatal(w, err)
	}
	if err := w.Commit(ctx, src, chunk.Key{}, false); err != nil {
		t.Fatal(err)
	}
	if ttl, _ := raw.PTTL(ctx, rt.keyName(k)).Result(); ttl <= 59*time.Minute || ttl > time.Hour {
		t.Fatalf("object TTL %v, want about 1h", ttl)
	}
	zstd, err := codec.Lookup("zstd")
	if err != nil {
		t.Fatal(err)
	}
	z := remote.Encode(remote.Guard(rt, remote.GuardOptions{Timeout: 10 * time.Second}), "redis", zstd, nil)
	if z.WritesRanges() {
		t.Fatal("a zstd tier writes ranges")
	}
	if w, err := z.OpenWrite(ctx, testKey(94, 2), len(src)); w != nil || err != nil {
		t.Fatalf("zstd OpenWrite: %v, %v", w, err)
	}
	_, _, off := stageStack(t, srv.url("layer_saves=false"), remote.GuardOptions{})
	if off.WritesRanges() {
		t.Fatal("a tier with layer_saves=false writes ranges")
	}
	if _, _, on := stageStack(t, srv.url("layer_saves=true"), remote.GuardOptions{}); !on.WritesRanges() {
		t.Fatal("a tier with layer_saves=true writes no ranges")
	}
	if _, err := remote.Open(ctx, srv.url("layer_saves=maybe"), remote.Options{}); err == nil {
		t.Fatal("layer_saves=maybe accepted")
	}
}

// TestStagedWriteRedisKilled: Redis killed mid-save (SIGKILL, with an
// append-only file fsync'ed on every write) fails the writes and the
// commit promptly; started again on its file, it holds no object for the
// key, and the staging key it kept still expires. While the breaker is
// open the tier writes no ranges, so saves leave it to the write queue.
func TestStagedWriteRedisKilled(t *testing.T) {
	srv := ownServer(t, "--appendonly", "yes", "--appendfsync", "always")
	rt, g, e := stageStack(t, srv.url(""), remote.GuardOptions{Timeout: 2 * time.Second, Threshold: 1, ProbeInterval: time.Hour})
	ctx := context.Background()
	src := payload(stageChunk, 34)
	k := testKey(95, 1)
	w, err := e.OpenWrite(ctx, k, len(src))
	if err != nil || w == nil {
		t.Fatal(w, err)
	}
	if err := writeLayer(t, w, src, 0); err != nil {
		t.Fatal(err)
	}
	srv.cmd.Process.Kill()
	srv.cmd.Wait()
	srv.cmd = nil
	srv.logs.Close()
	err = writeLayer(t, w, src, 1)
	if err == nil {
		err = w.Commit(ctx, src, chunk.Key{}, false)
	} else {
		w.Abort()
	}
	if err == nil {
		t.Fatal("a save into a killed Redis committed")
	}
	if !g.Open() || e.WritesRanges() {
		t.Fatalf("breaker open %v, writes ranges %v", g.Open(), e.WritesRanges())
	}
	if w, err := e.OpenWrite(ctx, testKey(95, 2), len(src)); w != nil || err != nil {
		t.Fatalf("OpenWrite with the breaker open: %v, %v", w, err)
	}
	srv.restart()
	raw := srv.rawClient()
	if n, err := raw.Exists(ctx, rt.keyName(k)).Result(); err != nil || n != 0 {
		t.Fatalf("object after the restart: %d, %v", n, err)
	}
	for _, s := range stagingKeys(t, raw, rt, k) {
		if ttl, _ := raw.PTTL(ctx, s).Result(); ttl <= 0 {
			t.Fatalf("staging key %s kept without a TTL (%v)", s, ttl)
		}
	}
}

// TestStagedWriteCluster publishes staged objects in a three-node Redis
// Cluster: the staging key shares its object key's slot (RENAME and the
// script would fail with CROSSSLOT otherwise), with the default prefix and
// with one carrying its own hash tag, and the objects read back.
func TestStagedWriteCluster(t *testing.T) {
	c := clusterNodes(t)
	ctx := context.Background()
	src := payload(stageChunk, 35)
	for _, query := range []string{"", "prefix=" + "{kv}/"} {
		_, _, e := stageStack(t, c.url(query), remote.GuardOptions{})
		for i := range 6 { // keys on every node
			k := testKey(uniqueScope(), i)
			w, err := e.OpenWrite(ctx, k, len(src))
			if err != nil || w == nil {
				t.Fatalf("%q: OpenWrite: %v, %v", query, w, err)
			}
			if err := writeAllLayers(t, w, src); err != nil {
				t.Fatalf("%q: %v", query, err)
			}
			got := make([]byte, len(src))
			if n, err := e.Get(ctx, k, got); err != nil || n != len(src) || !bytes.Equal(got, src) {
				t.Fatalf("%q: read back: %d, %v", query, n, err)
			}
		}
	}
}

// TestStageName keeps a key's own hash tag and adds one otherwise, and
// says when no staging key can share the key's slot.
func TestStageName(t *testing.T) {
	for name, want := range map[string]struct {
		stage    string
		sameSlot bool
	}{
		"kvtier/00ab":   {"{kvtier/00ab}:stage:0000000000000007", true},
		"{kv}/00ab":     {"{kv}/00ab:stage:0000000000000007", true},
		"x{y}z{w}/00ab": {"x{y}z{w}/00ab:stage:0000000000000007", true},
		"a{}b/00ab":     {"{a{}b/00ab}:stage:0000000000000007", false},
		"a}b/00ab":      {"{a}b/00ab}:stage:0000000000000007", false},
	} {
		if got, ok := stageName(name, 7); got != want.stage || ok != want.sameSlot {
			t.Errorf("stageName(%q) = %q, %v; want %q, %v", name, got, ok, want.stage, want.sameSlot)
		}
	}
}

// saveWhole does what a per-layer save does with each of chunks: a range
// write of every layer and a commit, all the chunks in parallel, and a
// whole Put of each chunk whose range write had no writer or failed, as
// the save's commit does. It returns the range writes' errors.
func saveWhole(t *testing.T, e *remote.Encoded, keys []chunk.Key, chunks [][]byte) []error {
	t.Helper()
	ctx := context.Background()
	errs := make([]error, len(keys))
	done := make(chan struct{})
	for i, k := range keys {
		go func() {
			defer func() { done <- struct{}{} }()
			w, err := e.OpenWrite(ctx, k, len(chunks[i]))
			if err == nil && w != nil {
				if err = writeAllLayers(t, w, chunks[i]); err == nil {
					return
				}
				w.Abort() // a no-op after a commit, which aborts itself
			}
			errs[i] = err
			if perr := e.Put(ctx, k, chunks[i]); perr != nil {
				errs[i] = fmt.Errorf("whole put after %v: %w", err, perr)
			}
		}()
	}
	for range keys {
		<-done
	}
	return errs
}

// checkStoredWhole checks that each chunk reads back byte-exact and that
// the breaker never counted a failure.
func checkStoredWhole(t *testing.T, what string, g *remote.Guarded, e *remote.Encoded, keys []chunk.Key, chunks [][]byte) {
	t.Helper()
	for i, k := range keys {
		got := make([]byte, len(chunks[i]))
		if n, err := e.Get(context.Background(), k, got); err != nil || n != len(got) || !bytes.Equal(got, chunks[i]) {
			t.Fatalf("%s: chunk %d read back: %d, %v", what, i, n, err)
		}
	}
	if h := g.Health(); h.State != remote.StateClosed || h.Failures != 0 || h.FastFails != 0 || h.Opens != 0 {
		t.Fatalf("%s: breaker %+v", what, h)
	}
}

// TestStagedWriteRefusedByRedis: a Redis that refuses the publish script
// (EVAL renamed away, as rename-command does; EVALSHA then answers
// NOSCRIPT) is healthy. Eight chunks saved in parallel get the refusal
// at their commit, which the breaker counts as an answer, not a failure
// (with a threshold of 5 it would open otherwise): it stays closed, the
// chunks are stored whole and read back byte-exact, no staging key is
// left, and staging is off for the tier from then on, so the next save
// opens no staging key at all.
func TestStagedWriteRefusedByRedis(t *testing.T) {
	srv := ownServer(t, "--rename-command", "EVAL", "")
	rt, g, e := stageStack(t, srv.url(""), strictBreaker)
	raw := srv.rawClient()
	keys, chunks := stageChunks(10, 40)
	keys2, keys := keys[8:], keys[:8]
	chunks = chunks[:8]
	if !e.WritesRanges() {
		t.Fatal("a raw Redis tier does not write ranges")
	}
	for i, err := range saveWhole(t, e, keys, chunks) {
		if !errors.Is(err, remote.ErrRefused) {
			t.Fatalf("chunk %d: range write ended with %v, want a refusal", i, err)
		}
	}
	checkStoredWhole(t, "EVAL renamed", g, e, keys, chunks)
	for _, k := range keys {
		if s := stagingKeys(t, raw, rt, k); len(s) != 0 {
			t.Fatalf("staging keys left: %v", s)
		}
	}
	if rt.Stages() || e.WritesRanges() {
		t.Fatal("staging still on after Redis refused the publish")
	}
	sets := commandCalls(t, raw, "set")
	for i, err := range saveWhole(t, e, keys2, chunks[:2]) {
		if err != nil {
			t.Fatalf("chunk %d of the next save: %v", i, err)
		}
	}
	if n := commandCalls(t, raw, "set"); n != sets+2 { // the two whole Puts, no staging key
		t.Fatalf("the next save sent %d SETs, want the 2 whole Puts", n-sets)
	}
	checkStoredWhole(t, "next save", g, e, keys2, chunks[:2])
}

// commandCalls is how many times the server was asked to run cmd: the
// calls it ran plus those it rejected (an ACL's NOPERM), from INFO
// commandstats.
func commandCalls(t *testing.T, c *goredis.Client, cmd string) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		n := 0
		for _, field := range strings.Split(rest, ",") {
			name, value, _ := strings.Cut(field, "=")
			if name != "calls" && name != "rejected_calls" {
				continue
			}
			v, err := strconv.Atoi(value)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			n += v
		}
		return n
	}
	return 0
}

// TestStagedWriteClusterPrefixWithoutTag: in a cluster, a prefix with a
// "}" but no hash tag lets no staging key share its object key's slot.
// The tier knows it from the start (Stages false): eight chunks saved in
// parallel open no staging key, the breaker stays closed (a refusal per
// OpenWrite would open it at the fifth), and the chunks are stored whole
// and read back byte-exact.
func TestStagedWriteClusterPrefixWithoutTag(t *testing.T) {
	c := clusterNodes(t)
	rt, g, e := stageStack(t, c.url("prefix=kv}/"), strictBreaker)
	if rt.Stages() || e.WritesRanges() {
		t.Fatal("a cluster tier whose prefix has a \"}\" but no tag stages")
	}
	keys, chunks := stageChunks(8, 50)
	for i, err := range saveWhole(t, e, keys, chunks) {
		if err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
	}
	checkStoredWhole(t, "prefix kv}/", g, e, keys, chunks)
	// Asked directly, Stage refuses without counting against the breaker.
	for range 8 {
		if _, err := g.Stage(context.Background(), keys[0], 1000); !errors.Is(err, remote.ErrRefused) {
			t.Fatalf("Stage with a slotless prefix: %v", err)
		}
	}
	if h := g.Health(); h.State != remote.StateClosed || h.Failures != 0 {
		t.Fatalf("breaker after refused stages: %+v", h)
	}
}

// TestStageLargeChunkDeadline: Redis zero-fills a staging key as Stage
// creates it, which takes time in proportion to its size, so Stage's
// deadline grows with the size as a Put's does. With a round-trip
// deadline of 1 ms, far below what zero-filling 64 MiB takes, and 64 MiB
// worth 4 s at the breaker's bandwidth, a 64 MiB chunk stages, its
// staging key at its full length, and the breaker counts no timeout. (Dropping the
// key, a DEL of 64 MiB, is left to the raw client: it is not what is
// tested.)
func TestStageLargeChunkDeadline(t *testing.T) {
	srv := sharedServer(t)
	rt, g, _ := stageStack(t, srv.url(""), remote.GuardOptions{Timeout: time.Millisecond, Bandwidth: 16 << 20, ProbeInterval: time.Hour})
	raw := srv.rawClient()
	ctx := context.Background()
	const size = 64 << 20
	k := testKey(uniqueScope(), 1)
	if _, err := g.Stage(ctx, k, size); err != nil {
		t.Fatalf("Stage of %d bytes: %v", size, err)
	}
	keys := stagingKeys(t, raw, rt, k)
	if len(keys) != 1 {
		t.Fatalf("staging keys %v", keys)
	}
	if n, err := raw.StrLen(ctx, keys[0]).Result(); err != nil || n != size {
		t.Fatalf("staging key of %d bytes (%v), want %d", n, err, size)
	}
	raw.Del(ctx, keys[0])
	if h := g.Health(); h.Timeouts != 0 || h.Failures != 0 {
		t.Fatalf("breaker after a large stage: %+v", h)
	}
}
