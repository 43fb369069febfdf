package kvtier_test

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/engine"
	"kvtier/server"
	"kvtier/tier"
	"kvtier/tier/kvtier"
	"kvtier/tier/mem"
	"kvtier/tier/remote"
)

const token = "remote-secret"

// remoteDaemon serves an engine over TCP and returns its address and a
// function that stops it.
func remoteDaemon(t *testing.T, addr string) (string, *engine.Engine, func()) {
	t.Helper()
	eng, err := engine.Open(engine.Options{ChunkSize: 16, RAMBytes: 32 << 20, Policy: "LRU"})
	if err != nil {
		t.Fatal(err)
	}
	svc := server.NewService(eng, server.ServiceOptions{Token: token})
	ln, err := svc.ListenTCP(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ln) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		svc.Shutdown(context.Background())
		<-done
		eng.Close()
	}
	t.Cleanup(stop)
	return ln.Addr().String(), eng, stop
}

func key(i int) chunk.Key {
	return chunk.Key{Scope: 0xfeed, Hash: chunk.Hash{byte(i), byte(i >> 8), 7}}
}

func payload(i, n int) []byte {
	b := make([]byte, n)
	for j := range b {
		b[j] = byte(i*13 + j)
	}
	return b
}

func open(t *testing.T, rawURL string) tier.Tier {
	t.Helper()
	tr, err := remote.Open(context.Background(), rawURL, remote.Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tier.Close(tr) })
	return tr
}

func TestRoundTripThroughAnotherDaemon(t *testing.T) {
	addr, eng, _ := remoteDaemon(t, "127.0.0.1:0")
	tr := open(t, "kvtier://"+token+"@"+addr)
	ctx := context.Background()
	for i := range 5 {
		if err := tr.Put(ctx, key(i), payload(i, 100_000+i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := tier.PrefixContains(tr, []chunk.Key{key(0), key(1), key(2), key(9), key(3)}); n != 3 {
		t.Errorf("PrefixContains = %d, want 3", n)
	}
	if size, ok := tr.Size(key(4)); !ok || size != 100_004 {
		t.Errorf("Size = %d %v", size, ok)
	}
	dst := make([]byte, 100_004)
	if n, err := tr.Get(ctx, key(4), dst); err != nil || n != 100_004 || !bytes.Equal(dst, payload(4, 100_004)) {
		t.Fatalf("Get: %d %v", n, err)
	}
	if _, err := tr.Get(ctx, key(99), dst); !errors.Is(err, tier.ErrNotFound) {
		t.Errorf("Get of a missing key: %v", err)
	}
	// The remote daemon holds them under the very same keys.
	if !eng.Manager().RAM().Contains(key(2)) {
		t.Error("the remote daemon does not hold the chunk under its key")
	}
	if err := tr.(remote.Pinger).Ping(ctx); err != nil {
		t.Error(err)
	}
	st := tier.StatsOf(tr)
	if st.Puts != 5 || st.Hits != 1 || st.Misses != 1 {
		t.Errorf("stats %+v", st)
	}
}

// TestAsLowerTierOfAManager stacks the remote daemon under a local RAM
// tier: stores reach it through the write queue, and after the local RAM
// is cleared a retrieve promotes the chunks back from it.
func TestAsLowerTierOfAManager(t *testing.T) {
	addr, _, _ := remoteDaemon(t, "127.0.0.1:0")
	tr := open(t, "kvtier://:"+token+"@"+addr+"?conns=2")
	a, err := arena.New(arena.Options{Capacity: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ram, err := mem.New(a, "LRU")
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := tier.NewManager(ram, []tier.Tier{remote.Guard(tr, remote.GuardOptions{})}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { mgr.Close(); a.Close() }()
	ctx := context.Background()
	keys := []chunk.Key{key(1), key(2), key(3)}
	chunks := [][]byte{payload(1, 64<<10), payload(2, 64<<10), payload(3, 64<<10)}
	if n, err := mgr.Store(ctx, keys, chunks); n != 3 || err != nil {
		t.Fatal(n, err)
	}
	if err := mgr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ram.Clear(0)
	dst := [][]byte{make([]byte, 64<<10), make([]byte, 64<<10), make([]byte, 64<<10)}
	n, err := mgr.Retrieve(ctx, keys, dst)
	if err != nil || n != 3 {
		t.Fatalf("retrieve through the remote tier: %d %v", n, err)
	}
	for i := range dst {
		if !bytes.Equal(dst[i], chunks[i]) {
			t.Fatalf("chunk %d differs", i)
		}
	}
	if mgr.Promoted() != 3 {
		t.Errorf("promoted %d, want 3", mgr.Promoted())
	}
}

func TestRefusesWrongTokenAndBadURLs(t *testing.T) {
	addr, _, _ := remoteDaemon(t, "127.0.0.1:0")
	if _, err := remote.Open(context.Background(), "kvtier://wrong@"+addr, remote.Options{}); err == nil {
		t.Error("a wrong token was accepted")
	}
	for _, raw := range []string{"kvtier://", "kvtier://host", "kvtier://h:1/path", "kvtier://h:1?conns=0", "kvtier://h:1?bogus=1", "kvtier://h:1?tls=maybe"} {
		u, _ := url.Parse(raw)
		if _, err := kvtier.ParseURL(u); err == nil {
			t.Errorf("%s accepted", raw)
		}
	}
}

// TestRemoteDaemonGoingAway: calls fail (and, guarded, fail fast) while
// the remote daemon is down, and work again once one listens again.
func TestRemoteDaemonGoingAway(t *testing.T) {
	addr, _, stop := remoteDaemon(t, "127.0.0.1:0")
	tr := open(t, "kvtier://"+token+"@"+addr)
	g := remote.Guard(tr, remote.GuardOptions{})
	ctx := context.Background()
	if err := g.Put(ctx, key(1), payload(1, 1000)); err != nil {
		t.Fatal(err)
	}
	stop()
	for range 10 {
		g.Put(ctx, key(2), payload(2, 1000))
	}
	start := time.Now()
	err := g.Put(ctx, key(3), payload(3, 1000))
	if err == nil {
		t.Fatal("a put to a stopped daemon succeeded")
	}
	if errors.Is(err, remote.ErrUnavailable) && time.Since(start) > time.Second {
		t.Errorf("an open circuit took %v to fail", time.Since(start))
	}
	// A new daemon on the same port: the tier reconnects by itself.
	remoteDaemon(t, addr)
	deadline := time.Now().Add(20 * time.Second)
	for g.Put(ctx, key(4), payload(4, 1000)) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the tier did not come back after the daemon restarted")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
