package p2p_test

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/engine"
	"kvtier/server"
	"kvtier/tier/p2p"
	"kvtier/tier/remote"
)

const token = "fleet-secret"

// daemon is an engine served over TCP in this process.
type daemon struct {
	eng  *engine.Engine
	addr string
	stop func()
}

// startDaemon serves an engine built from o over TCP on addr.
func startDaemon(t *testing.T, addr string, o engine.Options) *daemon {
	t.Helper()
	o.ChunkSize, o.Policy = 16, "LRU"
	if o.RAMBytes == 0 {
		o.RAMBytes = 32 << 20
	}
	eng, err := engine.Open(o)
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
	d := &daemon{eng: eng, addr: ln.Addr().String()}
	stopped := false
	d.stop = func() {
		if !stopped {
			stopped = true
			svc.Shutdown(context.Background())
			<-done
			eng.Close()
		}
	}
	t.Cleanup(d.stop)
	return d
}

func key(i int) chunk.Key {
	return chunk.Key{Scope: 0xbeef, Hash: chunk.Hash{byte(i), byte(i >> 8), 9}}
}

func payload(i, n int) []byte {
	b := make([]byte, n)
	for j := range b {
		b[j] = byte(i*31 + j*7)
	}
	return b
}

func keysOf(n int) []chunk.Key {
	ks := make([]chunk.Key, n)
	for i := range ks {
		ks[i] = key(i)
	}
	return ks
}

func store(t *testing.T, d *daemon, n, size int) {
	t.Helper()
	chunks := make([][]byte, n)
	for i := range chunks {
		chunks[i] = payload(i, size)
	}
	if got, err := d.eng.Manager().Store(context.Background(), keysOf(n), chunks); err != nil || got != n {
		t.Fatalf("Store = %d, %v", got, err)
	}
}

// retrieve reads n chunks through d's whole hierarchy and checks them.
func retrieve(t *testing.T, d *daemon, n, size int) int {
	t.Helper()
	dst := make([][]byte, n)
	for i := range dst {
		dst[i] = make([]byte, size)
	}
	got, err := d.eng.Manager().Retrieve(context.Background(), keysOf(n), dst)
	if err != nil {
		t.Fatalf("Retrieve: %v", err)
	}
	for i := range got {
		if !bytes.Equal(dst[i], payload(i, size)) {
			t.Fatalf("chunk %d differs from what was stored", i)
		}
	}
	return got
}

func p2pTier(t *testing.T, d *daemon) *p2p.Tier {
	t.Helper()
	for _, tr := range d.eng.Manager().Tiers() {
		if p, ok := tr.(*p2p.Tier); ok {
			return p
		}
	}
	t.Fatal("no p2p tier")
	return nil
}

func TestPullFromAPeersRAM(t *testing.T) {
	d1 := startDaemon(t, "127.0.0.1:0", engine.Options{})
	d2 := startDaemon(t, "127.0.0.1:0", engine.Options{P2PPeers: []string{d1.addr}, P2PToken: token})
	store(t, d1, 8, 100_000)
	if n, by := d2.eng.LookupKeys(keysOf(8)); n != 8 || by[1] != 8 {
		t.Fatalf("daemon 2 looks up %d chunks, by tier %v; want 8 from p2p", n, by)
	}
	if got := retrieve(t, d2, 8, 100_000); got != 8 {
		t.Fatalf("retrieved %d of 8", got)
	}
	// Promoted into daemon 2's RAM, as any lower-tier hit.
	for i := range 8 {
		if !d2.eng.InRAM(key(i)) {
			t.Fatalf("chunk %d was not promoted", i)
		}
	}
	// Daemon 2's own stores never reach daemon 1.
	chunks := [][]byte{payload(100, 1000)}
	if _, err := d2.eng.Manager().Store(context.Background(), []chunk.Key{key(100)}, chunks); err != nil {
		t.Fatal(err)
	}
	d2.eng.Flush(context.Background())
	if _, ok := d1.eng.Size(key(100)); ok {
		t.Fatal("a store on daemon 2 reached its peer")
	}
}

func TestPullFromAPeersDisk(t *testing.T) {
	const size, n = 200_000, 40 // 8 MB of chunks for a 2 MiB RAM tier
	d1 := startDaemon(t, "127.0.0.1:0", engine.Options{RAMBytes: 2 << 20, DiskDir: t.TempDir(), DiskBytes: 64 << 20})
	d2 := startDaemon(t, "127.0.0.1:0", engine.Options{P2PPeers: []string{d1.addr}, P2PToken: token})
	// Chunk by chunk, each on disk before the next: queued writes hold
	// RAM, which here has room for a few chunks only.
	for i := range n {
		if _, err := d1.eng.Manager().Store(context.Background(), []chunk.Key{key(i)}, [][]byte{payload(i, size)}); err != nil {
			t.Fatal(err)
		}
		if err := d1.eng.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if d1.eng.InRAM(key(0)) {
		t.Fatal("chunk 0 is still in daemon 1's RAM; the test needs it on disk only")
	}
	if got := retrieve(t, d2, 4, size); got != 4 {
		t.Fatalf("retrieved %d of 4 chunks from the peer's disk", got)
	}
}

// freeAddr returns a loopback address with a port free a moment ago, for
// daemons that must know each other's address before they start.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func TestSymmetricPeersDoNotLoop(t *testing.T) {
	a1, a2 := freeAddr(t), freeAddr(t)
	d1 := startDaemon(t, a1, engine.Options{P2PPeers: []string{a2}, P2PToken: token})
	d2 := startDaemon(t, a2, engine.Options{P2PPeers: []string{a1}, P2PToken: token})
	// Each daemon peers with the other. One that serves a peer answers
	// from its own RAM and disk only, so a miss on both is one lookup
	// each way, not a loop.
	start := time.Now()
	if n, _ := d2.eng.LookupKeys(keysOf(4)); n != 0 {
		t.Fatalf("lookup of nothing found %d", n)
	}
	if got := retrieve(t, d2, 4, 10); got != 0 {
		t.Fatalf("retrieved %d chunks nobody has", got)
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("a miss took %v", el)
	}
	store(t, d1, 4, 5000)
	if got := retrieve(t, d2, 4, 5000); got != 4 {
		t.Fatalf("retrieved %d of 4 from a symmetric peer", got)
	}
}

func TestDeadPeerIsAMissAndOpensTheCircuit(t *testing.T) {
	d1 := startDaemon(t, "127.0.0.1:0", engine.Options{})
	d2 := startDaemon(t, "127.0.0.1:0", engine.Options{P2PPeers: []string{d1.addr}, P2PToken: token})
	store(t, d1, 4, 50_000)
	d1.stop()
	deadline := time.Now().Add(5 * time.Second)
	for {
		start := time.Now()
		if got := retrieve(t, d2, 4, 50_000); got != 0 {
			t.Fatalf("retrieved %d chunks from a stopped peer", got)
		}
		if el := time.Since(start); el > time.Second {
			t.Fatalf("a miss on a stopped peer took %v", el)
		}
		if p2pTier(t, d2).Health()[d1.addr].State == remote.StateOpen {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the circuit never opened: %+v", p2pTier(t, d2).Health())
		}
	}
}

func TestWrongTokenIsAMiss(t *testing.T) {
	d1 := startDaemon(t, "127.0.0.1:0", engine.Options{})
	d2 := startDaemon(t, "127.0.0.1:0", engine.Options{P2PPeers: []string{d1.addr}, P2PToken: "wrong"})
	store(t, d1, 2, 1000)
	if got := retrieve(t, d2, 2, 1000); got != 0 {
		t.Fatalf("retrieved %d chunks with a wrong token", got)
	}
}
