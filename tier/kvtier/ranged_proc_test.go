package kvtier_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/client"
	"kvtier/codec"
	"kvtier/internal/servetest"
	"kvtier/kvformat"
	"kvtier/tier"
	"kvtier/tier/mem"
	"kvtier/tier/remote"
)

func TestMain(m *testing.M) {
	code := m.Run()
	servetest.Cleanup()
	os.Exit(code)
}

// The tests in this file read a kvtier:// tier by ranges from a real
// `kvtier serve` process on loopback (RETRIEVE_RANGES).

func noisy(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 3))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// remoteProc starts `kvtier serve` with a disk tier in dir (reused by a
// restart on the same dir).
func remoteProc(t *testing.T, dir string) *servetest.Daemon {
	t.Helper()
	disk := filepath.Join(dir, "disk")
	os.Remove(filepath.Join(dir, "kvtier.sock")) // left by a killed daemon
	return servetest.Start(t, dir, "chunk_size: 16\nmax_local_cpu_size: 0.0625\nmax_local_disk_size: 0.0625\nlocal_disk: "+disk+"\ntcp_token: "+token+"\n")
}

// stack opens the kvtier:// tier on d as the engine does: breaker, then
// envelope.
func stack(t *testing.T, d *servetest.Daemon) (*remote.Encoded, tier.Tier) {
	t.Helper()
	kt := open(t, "kvtier://"+token+"@"+d.TCP)
	return remote.Encode(remote.Guard(kt, remote.GuardOptions{Timeout: 2 * time.Second}), "kvtier", nil, nil), kt
}

func rawClient(t *testing.T, d *servetest.Daemon) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.DialTCP(ctx, d.TCP, client.Options{Token: token, Name: "kvtier-test", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestRangeReadsFromRemoteDaemon: a raw chunk put through the kvtier://
// tier is sealed as a pieced object on the remote daemon, and read back a
// range at a time with the stored bytes, from the daemon's RAM and, after
// a restart, from its disk, which it does not promote into RAM to serve
// them. A piece damaged in the stored object fails exactly its ranges; a
// version 1 object smaller than the piece table is read whole; the
// daemon killed between two ranges is an error, not a hang.
func TestRangeReadsFromRemoteDaemon(t *testing.T) {
	dir := t.TempDir()
	d := remoteProc(t, dir)
	e, _ := stack(t, d)
	if !e.ReadsRanges() {
		t.Fatal("a kvtier:// tier does not read ranges")
	}
	ctx := context.Background()
	data := noisy(1, 300_000) // pieces of 4 KiB
	k := key(1)
	if err := e.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	c := rawClient(t, d)
	sizes, err := c.Sizes(ctx, client.Raw([]chunk.Key{k}))
	if err != nil || len(sizes) != 1 || int(sizes[0]) != codec.PiecedHeaderSize+len(data) {
		t.Fatalf("stored object: %v, %v; want a pieced object of %d bytes", sizes, err, codec.PiecedHeaderSize+len(data))
	}
	readRanges := func(e *remote.Encoded) {
		t.Helper()
		if n, ok := e.Size(k); !ok || n != len(data) {
			t.Fatalf("Size = %d, %v", n, ok)
		}
		dst := bytes.Repeat([]byte{0xAA}, len(data))
		rr, err := e.OpenRange(ctx, k, dst)
		if err != nil {
			t.Fatal(err)
		}
		defer rr.Close()
		for _, rg := range [][2]int{{0, 10}, {150_000, 160_000}, {299_990, 300_000}} {
			if err := rr.ReadRange(ctx, rg[0], rg[1]); err != nil {
				t.Fatalf("range %v: %v", rg, err)
			}
			if !bytes.Equal(dst[rg[0]:rg[1]], data[rg[0]:rg[1]]) {
				t.Fatalf("range %v: wrong bytes", rg)
			}
		}
		if !bytes.Equal(dst[200_000:210_000], bytes.Repeat([]byte{0xAA}, 10_000)) {
			t.Fatal("bytes far from every range were written")
		}
	}
	readRanges(e)

	// A copy of the object with a byte of piece 5 changed, under k2.
	obj := [][]byte{make([]byte, sizes[0])}
	if n, _, err := c.Retrieve(ctx, client.Raw([]chunk.Key{k}), obj); err != nil || n != 1 {
		t.Fatalf("raw retrieve: %d, %v", n, err)
	}
	obj[0][codec.PiecedHeaderSize+5*4096+77] ^= 1
	k2 := key(2)
	if n, err := c.Store(ctx, client.Raw([]chunk.Key{k2}), obj); err != nil || n != 1 {
		t.Fatalf("raw store: %d, %v", n, err)
	}
	dst := make([]byte, len(data))
	rr, err := e.OpenRange(ctx, k2, dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := rr.ReadRange(ctx, 4*4096, 5*4096); err != nil || !bytes.Equal(dst[4*4096:5*4096], data[4*4096:5*4096]) {
		t.Fatalf("piece 4 of the damaged copy: %v", err)
	}
	if err := rr.ReadRange(ctx, 5*4096+70, 5*4096+80); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("the damaged piece: %v, want ErrCorrupt", err)
	}
	rr.Close()

	// A version 1 object of 100 bytes: 164 stored, fewer than a header
	// read asks for.
	small := noisy(3, 100)
	v1, err := codec.Seal(nil, mustCodec(t, "raw"), kvformat.Spec{}, small)
	if err != nil {
		t.Fatal(err)
	}
	k3 := key(3)
	if n, err := c.Store(ctx, client.Raw([]chunk.Key{k3}), [][]byte{v1}); err != nil || n != 1 {
		t.Fatalf("raw store: %d, %v", n, err)
	}
	dst = make([]byte, len(small))
	if rr, err = e.OpenRange(ctx, k3, dst); err != nil {
		t.Fatalf("open a version 1 object: %v", err)
	}
	if err := rr.ReadRange(ctx, 10, 20); err != nil || !bytes.Equal(dst, small) {
		t.Fatalf("version 1 object read by range: %v", err)
	}
	rr.Close()

	// After a restart the chunk is on the daemon's disk only: written
	// there first (FLUSH), since the kill gives the write queue no time.
	if _, err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	d.Kill()
	d = remoteProc(t, dir)
	hit, err := rawClient(t, d).Lookup(ctx, client.Raw([]chunk.Key{k}), 0)
	if err != nil || hit.Chunks != 1 || hit.ByTier[0] != 0 {
		t.Fatalf("after the restart: %+v, %v; want the chunk on disk only", hit, err)
	}
	e, _ = stack(t, d)
	readRanges(e)
	if hit, err = rawClient(t, d).Lookup(ctx, client.Raw([]chunk.Key{k}), 0); err != nil || hit.ByTier[0] != 0 {
		t.Fatalf("after range reads: %+v, %v; want the chunk still on disk only", hit, err)
	}

	// Killed between two ranges.
	dst = make([]byte, len(data))
	if rr, err = e.OpenRange(ctx, k, dst); err != nil {
		t.Fatal(err)
	}
	if err := rr.ReadRange(ctx, 0, 4096); err != nil {
		t.Fatal(err)
	}
	d.Kill()
	start := time.Now()
	if err := rr.ReadRange(ctx, 8192, 16384); err == nil {
		t.Fatal("a range read from a dead daemon succeeded")
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("a range read from a dead daemon took %v", el)
	}
	rr.Close()
}

func mustCodec(t *testing.T, name string) codec.Codec {
	t.Helper()
	c, err := codec.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestLayerwiseFromRemoteDaemon streams chunks put through the kvtier://
// tier back layer by layer (Manager.AcquireStream): each layer holds the
// stored bytes once Wait says so, and the remote daemon served ranges,
// never a whole chunk.
func TestLayerwiseFromRemoteDaemon(t *testing.T) {
	d := remoteProc(t, t.TempDir())
	e, _ := stack(t, d)
	const size = 128 << 10
	geo := tier.LayerGeometry{Layers: 8, Parts: 2}
	ctx := context.Background()
	keys := []chunk.Key{key(10), key(11), key(12)}
	for i, k := range keys {
		if err := e.Put(ctx, k, noisy(uint64(10+i), size)); err != nil {
			t.Fatal(err)
		}
	}
	a, err := arena.New(arena.Options{Capacity: 32 * size})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ram, err := mem.New(a, "LRU")
	if err != nil {
		t.Fatal(err)
	}
	m, err := tier.NewManager(ram, []tier.Tier{e}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ids := make([]arena.ID, len(keys))
	n, s, err := m.AcquireStream(ctx, keys, ids, func() tier.LayerGeometry { return geo }, time.Now().Add(time.Minute))
	if err != nil || n != len(keys) || s == nil {
		t.Fatalf("AcquireStream = %d, %v, %v", n, s, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for layer := range geo.Layers {
		usable, ready, err := s.Wait(wctx, layer)
		if err != nil || usable != len(keys) || ready <= layer {
			t.Fatalf("Wait(%d) = %d, %d, %v", layer, usable, ready, err)
		}
		for i, id := range ids {
			want := noisy(uint64(10+i), size)
			for part := range geo.Parts {
				from, to, _ := geo.Range(size, layer, part)
				if !bytes.Equal(a.Bytes(id)[from:to], want[from:to]) {
					t.Fatalf("chunk %d layer %d part %d: wrong bytes", i, layer, part)
				}
			}
		}
	}
	for !s.Done() {
		time.Sleep(time.Millisecond)
	}
	for _, id := range ids {
		a.Unref(id)
	}
	// By ranges: at least one RETRIEVE_RANGES per layer of each chunk
	// (layers are read up to three at a time once layer 0 is in), and
	// not one whole RETRIEVE.
	ranges, whole := d.Metric(t, `kvtier_requests_total{op="RETRIEVE_RANGES"}`), d.Metric(t, `kvtier_requests_total{op="RETRIEVE"}`)
	if got, _ := strconv.Atoi(ranges); got < len(keys)*geo.Layers/3 || whole != "0" {
		t.Fatalf("the daemon served %s RETRIEVE_RANGES and %s RETRIEVE; want ranges only", ranges, whole)
	}
}
