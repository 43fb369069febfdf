package p2p_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/client"
	"kvtier/internal/servetest"
	"kvtier/tier"
	"kvtier/tier/mem"
	"kvtier/tier/p2p"
)

// Layerwise reads of chunks that a peer holds only on its disk: the peer
// serves each range from its disk tier, piece checksums verified, without
// promoting the chunk into its RAM first (docs/layerwise.md, peers).

// noisy is chunk i's bytes: pseudo-random, so that any 64 bytes of it are
// found once in the peer's disk files.
func noisy(i, n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(i), 99))
	for j := 0; j < n; j += 8 {
		v := r.Uint64()
		for k := range min(8, n-j) {
			b[j+k] = byte(v >> (8 * k))
		}
	}
	return b
}

// diskPeer starts a daemon with a disk tier, stores n chunks of
// streamChunk bytes there, and restarts it on the same directories, so
// the chunks are on its disk only. damage, when set, runs while the
// daemon is down, on the disk tier's directory.
func diskPeer(t *testing.T, n int, damage func(dir string)) *servetest.Daemon {
	t.Helper()
	dir, disk := t.TempDir(), t.TempDir()
	conf := "chunk_size: 16\nmax_local_cpu_size: 0.0625\nmax_local_disk_size: 0.0625\nlocal_disk: " + disk + "\ntcp_token: " + token + "\n"
	d := servetest.Start(t, dir, conf)
	c := dial(t, d.TCP)
	ctx := context.Background()
	for i, k := range keysOf(n) {
		if got, err := c.Store(ctx, client.Raw([]chunk.Key{k}), [][]byte{noisy(i, streamChunk)}); err != nil || got != 1 {
			t.Fatalf("store chunk %d: %d, %v", i, got, err)
		}
	}
	if _, err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c.Close()
	d.Kill()
	if damage != nil {
		damage(disk)
	}
	os.Remove(filepath.Join(dir, "kvtier.sock"))
	d = servetest.Start(t, dir, conf)
	hit, err := dial(t, d.TCP).Lookup(ctx, client.Raw(keysOf(n)), 0)
	if err != nil || hit.ByTier[0] != 0 || int(hit.Chunks) != n {
		t.Fatalf("after the restart: %+v, %v; want every chunk on disk, none in RAM", hit, err)
	}
	return d
}

// flipIn changes one byte of the first file under dir that holds want.
func flipIn(t *testing.T, dir string, want []byte) {
	t.Helper()
	found := false
	filepath.WalkDir(dir, func(path string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() || found {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		if at := bytes.Index(b, want); at >= 0 {
			b[at+len(want)/2] ^= 0x10
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			found = true
		}
		return nil
	})
	if !found {
		t.Fatal("the bytes to damage are in no file of the disk tier")
	}
}

// streamLayers reads keys from daemon d layer by layer over its local
// socket (PREPARE_RETRIEVE_LAYERS, LAYER_WAIT) and checks each ready
// layer of each usable chunk against noisy. It returns the usable count
// once every layer is in.
func streamLayers(t *testing.T, d *servetest.Daemon, keys []chunk.Key) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.DialUnix(ctx, d.Sock, client.Options{Name: "lw-test", Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	slots, err := c.PrepareRetrieveLayers(ctx, client.Raw(keys), streamGeo.Layers, streamGeo.Parts, 20_000)
	if err != nil || len(slots.Slots) != len(keys) {
		t.Fatalf("PREPARE_RETRIEVE_LAYERS: %+v, %v", slots, err)
	}
	usable := len(keys)
	for layer := range streamGeo.Layers {
		r, err := c.LayerWait(ctx, slots.Lease, layer)
		if err != nil || int(r.Ready) <= layer && int(r.Usable) > 0 {
			t.Fatalf("LAYER_WAIT(%d): %+v, %v", layer, r, err)
		}
		usable = min(usable, int(r.Usable))
		for i := range usable {
			b, err := c.Slot(slots.Slots[i])
			if err != nil {
				t.Fatal(err)
			}
			want := noisy(i, streamChunk)
			for part := range streamGeo.Parts {
				from, to, _ := streamGeo.Range(streamChunk, layer, part)
				if !bytes.Equal(b[from:to], want[from:to]) {
					t.Fatalf("chunk %d layer %d part %d: wrong bytes", i, layer, part)
				}
			}
		}
	}
	if err := c.Release(ctx, slots.Lease); err != nil {
		t.Fatal(err)
	}
	return usable
}

// streamerConf is daemon A's configuration: B as its peer, with a
// deadline that only guards against a hang. At the default 100 ms, a
// loaded machine made A's calls to B miss it, and the streams came out
// with no usable chunk.
func streamerConf(b *servetest.Daemon) string {
	return "chunk_size: 16\nmax_local_cpu_size: 0.0625\nremote_timeout: 10s\np2p_peers: [" + b.TCP + "]"
}

// TestLayerwiseFromPeerDisk: daemon B holds four chunks on its disk only;
// daemon A (p2p_peers: B) streams them layer by layer to a local client,
// every layer with B's bytes; B served the ranges from its disk and never
// promoted the chunks into its RAM.
func TestLayerwiseFromPeerDisk(t *testing.T) {
	keys := keysOf(4)
	b := diskPeer(t, len(keys), nil)
	a := startProc(t, streamerConf(b))
	if got := streamLayers(t, a.Daemon, keys); got != len(keys) {
		t.Fatalf("%d usable chunks, want %d", got, len(keys))
	}
	hit, err := dial(t, b.TCP).Lookup(context.Background(), client.Raw(keys), 0)
	if err != nil || hit.Chunks != 4 || hit.ByTier[0] != 0 {
		t.Fatalf("on B after the stream: %+v, %v; want all on disk, none promoted into RAM", hit, err)
	}
	// A holds them in its RAM now, with the same bytes.
	dst := make([][]byte, len(keys))
	for i := range dst {
		dst[i] = make([]byte, streamChunk)
	}
	n, _, err := dial(t, a.TCP).Retrieve(context.Background(), client.Raw(keys), dst)
	if err != nil || n != len(keys) {
		t.Fatalf("from A's RAM: %d, %v", n, err)
	}
	for i := range dst {
		if !bytes.Equal(dst[i], noisy(i, streamChunk)) {
			t.Fatalf("chunk %d in A's RAM: wrong bytes", i)
		}
	}
}

// TestLayerwiseFromPeerDiskDamaged: a byte changed in layer 3 of chunk 2
// on B's disk fails that range's piece checksum on B, which then serves
// chunk 2 as a miss: A's stream ends its usable prefix at 2 (the client
// recomputes chunks 2 and 3), chunks 0 and 1 keep B's bytes, and A never
// holds chunk 2 or 3.
func TestLayerwiseFromPeerDiskDamaged(t *testing.T) {
	keys := keysOf(4)
	from, _, _ := streamGeo.Range(streamChunk, 3, 0)
	b := diskPeer(t, len(keys), func(dir string) { flipIn(t, dir, noisy(2, streamChunk)[from+100:from+164]) })
	a := startProc(t, streamerConf(b))
	if got := streamLayers(t, a.Daemon, keys); got != 2 {
		t.Fatalf("%d usable chunks, want 2 (a damaged piece in chunk 2)", got)
	}
	hit, err := dial(t, a.TCP).Lookup(context.Background(), client.Raw(keys), 0)
	if err != nil || hit.Chunks != 2 {
		t.Fatalf("A after the stream: %+v, %v; want chunks 0 and 1 only", hit, err)
	}
}

// TestStreamFromPeerDiskKilledMidStream: B holds the chunks on disk only
// and is killed once layer 0 of every chunk came from its disk; every
// chunk becomes unusable, none is made visible in RAM, nothing stays
// pinned, and no wait outlives its bound.
func TestStreamFromPeerDiskKilledMidStream(t *testing.T) {
	keys := keysOf(4)
	b := diskPeer(t, len(keys), nil)
	a, err := arena.New(arena.Options{Capacity: 64 * streamChunk})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ram, err := mem.New(a, "LRU")
	if err != nil {
		t.Fatal(err)
	}
	tr := p2p.NewStatic([]string{b.TCP}, p2p.Options{Token: token, Timeout: 2 * time.Second})
	gate := make(chan struct{})
	m, err := tier.NewManager(ram, []tier.Tier{gatedPeers{tr, gate}}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	ids := make([]arena.ID, len(keys))
	n, s, err := m.AcquireStream(ctx, keys, ids, func() tier.LayerGeometry { return streamGeo }, time.Now().Add(time.Minute))
	if err != nil || n != 4 || s == nil {
		t.Fatalf("AcquireStream = %d, %v, %v", n, s, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if usable, ready, err := s.Wait(wctx, 0); err != nil || usable != 4 || ready != 1 {
		t.Fatalf("Wait(0) = %d usable, %d ready, %v; want 4, 1", usable, ready, err)
	}
	for i, id := range ids {
		for part := range streamGeo.Parts {
			from, to, _ := streamGeo.Range(streamChunk, 0, part)
			if !bytes.Equal(a.Bytes(id)[from:to], noisy(i, streamChunk)[from:to]) {
				t.Fatalf("chunk %d layer 0 part %d: wrong bytes", i, part)
			}
		}
	}
	b.Kill()
	close(gate)
	start := time.Now()
	if usable, _, err := s.Wait(wctx, streamGeo.Layers-1); err != nil || usable != 0 {
		t.Fatalf("after B died: %d usable, %v; want 0 (recompute)", usable, err)
	}
	if el := time.Since(start); el > 20*time.Second {
		t.Fatalf("the stream took %v to give up on a dead peer", el)
	}
	for !s.Done() {
		time.Sleep(time.Millisecond)
	}
	for i, k := range keys {
		if ram.Contains(k) {
			t.Fatalf("chunk %d became visible in RAM from a dead peer", i)
		}
	}
	for _, id := range ids {
		a.Unref(id)
	}
	if p := a.Pinned(); p != 0 {
		t.Fatalf("%d bytes pinned after the stream", p)
	}
}
