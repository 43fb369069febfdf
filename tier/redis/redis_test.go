package redis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/tier"
	"kvtier/tier/remote"
)

// testKey returns a distinct key per (scope, i) with a random-looking hash,
// the way real chained hashes look.
func testKey(scope uint64, i int) chunk.Key {
	r := rand.New(rand.NewPCG(scope, uint64(i)))
	var k chunk.Key
	k.Scope = scope
	for j := range k.Hash {
		k.Hash[j] = byte(r.Uint32())
	}
	return k
}

// payload returns n pseudo-random bytes, different for each seed, standing
// in for encoded KV chunks.
func payload(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

// uniqueScope gives each test its own keys on the shared servers.
var scopeCounter atomic.Uint64

func uniqueScope() uint64 { return uint64(time.Now().UnixNano())<<8 + scopeCounter.Add(1) }

func TestKeyName(t *testing.T) {
	tr := &Tier{prefix: "p/"}
	k := chunk.Key{Scope: 0x0123456789abcdef}
	for i := range k.Hash {
		k.Hash[i] = byte(0xf0 + i)
	}
	got := tr.keyName(k)
	want := "p/0123456789abcdef" + "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff"
	if got != want {
		t.Fatalf("keyName = %q, want %q", got, want)
	}
	long := &Tier{prefix: strings.Repeat("x", 100)}
	if n := len(long.keyName(k)); n != 148 {
		t.Fatalf("long prefix key has %d bytes, want 148", n)
	}
}

func TestRoundTrip(t *testing.T) {
	srv := sharedServer(t)
	tr := openTier(t, srv.url(""))
	ctx := context.Background()
	scope := uniqueScope()
	sizes := []int{1, 4096, 3<<20 + 7, 32 << 20}
	for i, size := range sizes {
		k := testKey(scope, i)
		data := payload(size, uint64(i))
		if tier.Contains(tr, k) {
			t.Fatalf("size %d: key present before Put", size)
		}
		if err := tr.Put(ctx, k, data); err != nil {
			t.Fatalf("put %d bytes: %v", size, err)
		}
		if n, ok := tr.Size(k); !ok || n != size {
			t.Fatalf("Size = %d, %v; want %d", n, ok, size)
		}
		// Exactly sized, as the manager reads, and with room to spare.
		for _, extra := range []int{0, 1, 2, 100} {
			dst := make([]byte, size+extra)
			n, err := tr.Get(ctx, k, dst)
			if err != nil {
				t.Fatalf("get %d bytes into %d: %v", size, len(dst), err)
			}
			if n != size || !bytes.Equal(dst[:n], data) {
				t.Fatalf("get %d bytes into %d: got %d bytes, equal=%v", size, len(dst), n, bytes.Equal(dst[:n], data))
			}
		}
	}
	// A fresh tier has no cache: Size and Contains must ask Redis.
	fresh := openTier(t, srv.url("cache=0"))
	if n, ok := fresh.Size(testKey(scope, 2)); !ok || n != sizes[2] {
		t.Fatalf("uncached Size = %d, %v; want %d", n, ok, sizes[2])
	}
	st := tr.Stats()
	if st.Puts != uint64(len(sizes)) || st.Hits != uint64(4*len(sizes)) || st.Name != "redis" {
		t.Fatalf("stats %+v", st)
	}
	var total uint64
	for _, s := range sizes {
		total += uint64(s)
	}
	if st.BytesWritten != total || st.BytesRead != 4*total {
		t.Fatalf("stats bytes written %d read %d, want %d and %d", st.BytesWritten, st.BytesRead, total, 4*total)
	}
}

func TestMissingKeys(t *testing.T) {
	srv := sharedServer(t)
	tr := openTier(t, srv.url(""))
	ctx := context.Background()
	k := testKey(uniqueScope(), 0)
	if _, err := tr.Get(ctx, k, make([]byte, 10)); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("Get of missing key: %v, want ErrNotFound", err)
	}
	if tier.Contains(tr, k) {
		t.Fatal("Contains of missing key")
	}
	if _, ok := tr.Size(k); ok {
		t.Fatal("Size of missing key")
	}
	if tr.Remove(k) {
		t.Fatal("Remove of missing key reported true")
	}
	if got := tr.Stats().Misses; got != 1 {
		t.Fatalf("misses = %d, want 1", got)
	}
}

func TestPrefixContains(t *testing.T) {
	srv := sharedServer(t)
	checkPrefixContains(t, openTier(t, srv.url("")), openTier(t, srv.url("")))
}

// checkPrefixContains stores keys 0..n-1 except one gap through tr and
// checks the leading run through cold, a second tier on the same
// deployment whose cache has never seen the keys.
func checkPrefixContains(t *testing.T, tr, cold *Tier) {
	ctx := context.Background()
	scope := uniqueScope()
	keys := make([]chunk.Key, 200)
	for i := range keys {
		keys[i] = testKey(scope, i)
	}
	const gap = 150
	for i, k := range keys {
		if i == gap {
			continue
		}
		if err := tr.Put(ctx, k, payload(100+i, uint64(i))); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		keys []chunk.Key
		want int
	}{
		{keys, gap},
		{keys[:gap], gap},
		{keys[gap:], 0},
		{keys[gap+1:], len(keys) - gap - 1},
		{nil, 0},
	}
	for i, c := range cases {
		if got := cold.PrefixContains(c.keys); got != c.want {
			t.Errorf("case %d: PrefixContains = %d, want %d", i, got, c.want)
		}
	}
	// What PrefixContains found is now known with its size, no round trip.
	// (Asked last, so that no other key of this test can have taken its
	// slot in the direct-mapped cache since.)
	cold.PrefixContains(keys[7:8])
	if n, ok := cold.known.size(keys[7]); !ok || n != 107 {
		t.Fatalf("presence cache after PrefixContains: %d, %v; want 107", n, ok)
	}
}

func TestShortBuffer(t *testing.T) {
	srv := sharedServer(t)
	tr := openTier(t, srv.url("pool=1")) // one connection: it must stay usable
	ctx := context.Background()
	k := testKey(uniqueScope(), 0)
	data := payload(1<<20, 1)
	if err := tr.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	_, err := tr.Get(ctx, k, make([]byte, len(data)-1))
	if !errors.Is(err, io.ErrShortBuffer) {
		t.Fatalf("Get into short buffer: %v, want io.ErrShortBuffer", err)
	}
	dst := make([]byte, len(data))
	if n, err := tr.Get(ctx, k, dst); err != nil || !bytes.Equal(dst[:n], data) {
		t.Fatalf("Get after short buffer: %d, %v", n, err)
	}
}

func TestPutExistingKeepsFirst(t *testing.T) {
	srv := sharedServer(t)
	tr := openTier(t, srv.url(""))
	ctx := context.Background()
	k := testKey(uniqueScope(), 0)
	first, second := payload(1000, 1), payload(1000, 2)
	if err := tr.Put(ctx, k, first); err != nil {
		t.Fatal(err)
	}
	if err := tr.Put(ctx, k, second); err != nil {
		t.Fatalf("Put of existing key: %v, want success", err)
	}
	dst := make([]byte, 1000)
	if _, err := tr.Get(ctx, k, dst); err != nil || !bytes.Equal(dst, first) {
		t.Fatalf("value after second Put differs from the first (err %v)", err)
	}
	if got := tr.Stats().Puts; got != 1 {
		t.Fatalf("Puts = %d, want 1 (second was a no-op)", got)
	}
	if err := tr.Put(ctx, k, nil); err == nil {
		t.Fatal("Put of empty object succeeded")
	}
}

func TestRemove(t *testing.T) {
	srv := sharedServer(t)
	tr := openTier(t, srv.url(""))
	ctx := context.Background()
	k := testKey(uniqueScope(), 0)
	if err := tr.Put(ctx, k, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if !tr.Remove(k) {
		t.Fatal("Remove of stored key reported false")
	}
	if tier.Contains(tr, k) {
		t.Fatal("Contains after Remove")
	}
	if _, err := tr.Get(ctx, k, make([]byte, 1)); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("Get after Remove: %v", err)
	}
}

func TestTTLAndPrefix(t *testing.T) {
	srv := sharedServer(t)
	tr := openTier(t, srv.url("ttl=1h&prefix=other:"))
	ctx := context.Background()
	k := testKey(uniqueScope(), 0)
	if err := tr.Put(ctx, k, []byte("abc")); err != nil {
		t.Fatal(err)
	}
	name := tr.keyName(k)
	if !strings.HasPrefix(name, "other:") {
		t.Fatalf("key %q lacks prefix", name)
	}
	ttl, err := srv.rawClient().PTTL(ctx, name).Result()
	if err != nil || ttl <= 0 || ttl > time.Hour {
		t.Fatalf("PTTL = %v, %v; want in (0, 1h]", ttl, err)
	}
}

// TestForeignValues writes values the tier did not write under its key
// names: they come back as bytes (the codec above rejects them) or as
// ErrCorrupt when they are not strings at all.
func TestForeignValues(t *testing.T) {
	srv := sharedServer(t)
	tr := openTier(t, srv.url(""))
	raw := srv.rawClient()
	ctx := context.Background()
	scope := uniqueScope()

	garbage, empty, hash := testKey(scope, 0), testKey(scope, 1), testKey(scope, 2)
	if err := raw.Set(ctx, tr.keyName(garbage), "\x00not a chunk\r\n$5\r\n", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := raw.Set(ctx, tr.keyName(empty), "", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := raw.HSet(ctx, tr.keyName(hash), "f", "v").Err(); err != nil {
		t.Fatal(err)
	}

	dst := make([]byte, 64)
	n, err := tr.Get(ctx, garbage, dst)
	if err != nil || string(dst[:n]) != "\x00not a chunk\r\n$5\r\n" {
		t.Fatalf("Get of foreign string: %q, %v", dst[:n], err)
	}
	if size, ok := tr.Size(garbage); !ok || size != n {
		t.Fatalf("Size of foreign string = %d, %v; want %d", size, ok, n)
	}
	// An empty string is indistinguishable from absence for STRLEN.
	if tier.Contains(tr, empty) {
		t.Fatal("Contains reports an empty value")
	}
	if n, err := tr.Get(ctx, empty, dst); err != nil || n != 0 {
		t.Fatalf("Get of empty value: %d, %v; want 0 bytes", n, err)
	}
	if _, err := tr.Get(ctx, hash, dst); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("Get of a hash: %v, want ErrCorrupt", err)
	}
	if tier.Contains(tr, hash) || tr.PrefixContains([]chunk.Key{hash}) != 0 {
		t.Fatal("a hash counts as stored")
	}
	// Each meeting counts: the Get, Contains' STRLEN, the pipeline's.
	if got := tr.Stats().Corrupt; got != 3 {
		t.Fatalf("Corrupt = %d, want 3", got)
	}
	// The connection is still in step after the error replies.
	if _, err := tr.Get(ctx, garbage, dst); err != nil {
		t.Fatalf("Get after WRONGTYPE: %v", err)
	}
}

// TestConcurrentWriters races writers of one key, each with its own bytes,
// against readers: every read must be one writer's value, whole.
func TestConcurrentWriters(t *testing.T) {
	srv := sharedServer(t)
	tr := openTier(t, srv.url(""))
	ctx := context.Background()
	k := testKey(uniqueScope(), 0)
	const size = 1 << 20
	const writers, readers, rounds = 4, 4, 30
	values := make([][]byte, writers)
	for w := range values {
		values[w] = bytes.Repeat([]byte{byte('a' + w)}, size)
	}

	var wg sync.WaitGroup
	var reads, whole atomic.Int64
	errs := make(chan error, writers+readers)
	for w := range writers {
		wg.Go(func() {
			for r := range rounds {
				if err := tr.Put(ctx, k, values[w]); err != nil {
					errs <- fmt.Errorf("writer %d: %w", w, err)
					return
				}
				if r%3 == w%3 { // let the next writer win the next SET NX
					tr.Remove(k)
				}
			}
		})
	}
	for r := range readers {
		wg.Go(func() {
			dst := make([]byte, size)
			for range rounds * 2 {
				n, err := tr.Get(ctx, k, dst)
				if errors.Is(err, tier.ErrNotFound) {
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("reader %d: %w", r, err)
					return
				}
				reads.Add(1)
				if n != size || bytes.Count(dst, dst[:1]) != size {
					errs <- fmt.Errorf("reader %d: read of %d bytes mixes writes", r, n)
					return
				}
				whole.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if reads.Load() == 0 {
		t.Fatal("no reader ever found the key")
	}
	t.Logf("%d whole reads", whole.Load())
}

// TestServerRestart stops the server under a working tier: calls fail
// without panicking, then succeed again once the server is back.
func TestServerRestart(t *testing.T) {
	srv := startServer(t)
	srv.waitReady()
	tr := openTier(t, srv.url(""))
	ctx := context.Background()
	scope := uniqueScope()
	before, after := testKey(scope, 0), testKey(scope, 1)
	data := payload(2<<20, 3)
	if err := tr.Put(ctx, before, data); err != nil {
		t.Fatal(err)
	}

	srv.stop()
	dst := make([]byte, len(data))
	if _, err := tr.Get(ctx, before, dst); err == nil || errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("Get with server down: %v, want a network error", err)
	}
	if err := tr.Put(ctx, after, data); err == nil {
		t.Fatal("Put with server down succeeded")
	}
	if err := tr.Ping(ctx); err == nil {
		t.Fatal("Ping with server down succeeded")
	}
	if tr.PrefixContains([]chunk.Key{after}) != 0 || tier.Contains(tr, after) || tr.Remove(after) {
		t.Fatal("presence calls with server down report a key")
	}

	srv.restart() // persistence is off: the server comes back empty
	waitFor(t, "tier ping after restart", func() error { return tr.Ping(ctx) })
	if err := tr.Put(ctx, after, data); err != nil {
		t.Fatalf("Put after restart: %v", err)
	}
	if n, err := tr.Get(ctx, after, dst); err != nil || !bytes.Equal(dst[:n], data) {
		t.Fatalf("Get after restart: %d, %v", n, err)
	}
	// The cache still believes in the lost key; Get corrects it.
	if _, err := tr.Get(ctx, before, dst); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("Get of key lost in restart: %v, want ErrNotFound", err)
	}
	if tier.Contains(tr, before) {
		t.Fatal("key lost in restart still reported after a failed Get")
	}
}

func TestClosed(t *testing.T) {
	srv := sharedServer(t)
	tr := openTier(t, srv.url(""))
	ctx := context.Background()
	k := testKey(uniqueScope(), 0)
	if err := tr.Put(ctx, k, []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := tr.Get(ctx, k, make([]byte, 1)); !errors.Is(err, tier.ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
	if err := tr.Put(ctx, k, []byte("v")); !errors.Is(err, tier.ErrClosed) {
		t.Fatalf("Put after Close: %v", err)
	}
	if err := tr.Ping(ctx); !errors.Is(err, tier.ErrClosed) {
		t.Fatalf("Ping after Close: %v", err)
	}
	if tier.Contains(tr, k) || tr.PrefixContains([]chunk.Key{k}) != 0 || tr.Remove(k) {
		t.Fatal("closed tier reports keys")
	}
}

func TestContextDeadline(t *testing.T) {
	srv := sharedServer(t)
	tr := openTier(t, srv.url(""))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	k := testKey(uniqueScope(), 0)
	if err := tr.Put(ctx, k, []byte("v")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Put with cancelled context: %v", err)
	}
	if _, err := tr.Get(ctx, k, make([]byte, 1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Get with cancelled context: %v", err)
	}
}

// TestOpenUnreachable checks Open fails, rather than hands out a dead tier.
func TestOpenUnreachable(t *testing.T) {
	port := freePort(t, false)
	_, err := Open(context.Background(), mustParse(t, fmt.Sprintf("redis://127.0.0.1:%d", port)), remoteOptions(time.Second))
	if err == nil {
		t.Fatal("Open of a port nothing listens on succeeded")
	}
}

func TestCluster(t *testing.T) {
	c := clusterNodes(t)
	tr := openTier(t, c.url(""))
	ctx := context.Background()
	if tr.topology != Cluster {
		t.Fatalf("topology %v, want Cluster", tr.topology)
	}
	if err := tr.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	checkPrefixContains(t, tr, openTier(t, c.url("")))

	// Keys land on every node, and PrefixContains sees them all.
	scope := uniqueScope()
	keys := make([]chunk.Key, 60)
	for i := range keys {
		keys[i] = testKey(scope, i)
		if err := tr.Put(ctx, keys[i], payload(50, uint64(i))); err != nil {
			t.Fatal(err)
		}
	}
	// A node answers EXISTS for its own slots and MOVED for the others.
	total := 0
	for _, n := range c.nodes {
		raw := n.rawClient()
		held := 0
		for _, k := range keys {
			if found, err := raw.Exists(ctx, tr.keyName(k)).Result(); err == nil && found == 1 {
				held++
			}
		}
		if held == 0 {
			t.Fatalf("node %s holds none of %d keys: not spread over slots", n.addr(), len(keys))
		}
		total += held
	}
	if total != len(keys) {
		t.Fatalf("nodes hold %d keys in all, want %d", total, len(keys))
	}
	if got := openTier(t, c.url("cache=0")).PrefixContains(keys); got != len(keys) {
		t.Fatalf("cluster PrefixContains = %d, want %d", got, len(keys))
	}

	// A seed list of one node is enough: the client learns the rest.
	one := openTier(t, "redis+cluster://"+c.nodes[1].addr())
	big := payload(8<<20, 9)
	k := testKey(scope, 1000)
	if err := one.Put(ctx, k, big); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, len(big))
	if n, err := tr.Get(ctx, k, dst); err != nil || !bytes.Equal(dst[:n], big) {
		t.Fatalf("cluster round trip: %d, %v", n, err)
	}
	if _, err := tr.Get(ctx, testKey(scope, 1001), dst); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("cluster Get of missing key: %v", err)
	}
}

func TestRegisteredSchemes(t *testing.T) {
	for scheme := range schemes {
		// Reaching this package's URL check proves the scheme is registered.
		_, err := remote.Open(context.Background(), scheme+"://", remote.Options{})
		if err == nil || !strings.Contains(err.Error(), "no host") {
			t.Errorf("%s:// without host: %v", scheme, err)
		}
	}
}

func remoteOptions(timeout time.Duration) remote.Options {
	return remote.Options{Timeout: timeout}
}
