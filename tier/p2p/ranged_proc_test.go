package p2p_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/tier"
	"kvtier/tier/p2p"
)

// readLayers reads key's chunk from tr in eight ranges, checking after
// each that the bytes so far are the stored ones and that nothing past
// them was written: the chunk arrives a range at a time.
func readLayers(t *testing.T, tr *p2p.Tier, i, size int) {
	t.Helper()
	ctx := context.Background()
	if n, ok := tr.Size(key(i)); !ok || n != size {
		t.Fatalf("chunk %d: size %d, %v", i, n, ok)
	}
	dst := bytes.Repeat([]byte{0xAA}, size)
	r, err := tr.OpenRange(ctx, key(i), dst)
	if err != nil {
		t.Fatalf("chunk %d: %v", i, err)
	}
	defer r.Close()
	want := payload(i, size)
	step := size / 8
	for to := step; to <= size; to += step {
		if err := r.ReadRange(ctx, to-step, to); err != nil {
			t.Fatalf("chunk %d: range to %d: %v", i, to, err)
		}
		if !bytes.Equal(dst[:to], want[:to]) {
			t.Fatalf("chunk %d: wrong bytes before %d", i, to)
		}
		if to < size && dst[to] != 0xAA {
			t.Fatalf("chunk %d: byte %d written before its range was read", i, to)
		}
	}
}

// TestRangeReadsFromPeer streams chunks range by range out of a real
// daemon's RAM and disk, then kills it in the middle of a chunk: the range
// asked after is an error and leaves its bytes untouched, never wrong.
func TestRangeReadsFromPeer(t *testing.T) {
	const size = 256 << 10
	d1 := startProc(t, "chunk_size: 16\nmax_local_cpu_size: 0.00390625\nmax_local_disk_size: 0.0625\nlocal_disk: "+t.TempDir())
	c1 := dial(t, d1.TCP)
	ctx := context.Background()
	for i := range 30 {
		if n, err := c1.Store(ctx, client.Raw([]chunk.Key{key(i)}), [][]byte{payload(i, size)}); err != nil || n != 1 {
			t.Fatalf("store chunk %d: %d, %v", i, n, err)
		}
		if _, err := c1.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	hit, err := c1.Lookup(ctx, client.Raw([]chunk.Key{key(0)}), 0)
	if err != nil || hit.Chunks != 1 || hit.ByTier[0] != 0 {
		t.Fatalf("chunk 0: %+v, %v; want it on disk only", hit, err)
	}
	tr := p2p.NewStatic([]string{d1.TCP}, p2p.Options{Token: token, Timeout: 2 * time.Second})
	defer tr.Close()
	var _ tier.RangeReader = tr
	readLayers(t, tr, 29, size) // in RAM
	readLayers(t, tr, 0, size)  // on disk
	if st := tr.Stats(); st.Hits != 2 || st.BytesRead != 2*size {
		t.Fatalf("stats %+v, want 2 hits of %d bytes", st, size)
	}
	// A range read on the open connection allocates nothing (raceless
	// builds only: the race detector allocates).
	if _, ok := tr.Size(key(27)); !ok {
		t.Fatal("chunk 27 is gone")
	}
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	r, err := tr.OpenRange(dctx, key(27), make([]byte, size))
	if err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(50, func() {
		if err := r.ReadRange(dctx, 4096, 8192); err != nil {
			t.Fatal(err)
		}
	})
	r.Close()
	if allocs != 0 && !raceEnabled {
		t.Fatalf("%v allocations per range read", allocs)
	}
	if _, err := tr.OpenRange(ctx, key(999), make([]byte, size)); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("a chunk no peer holds: %v", err)
	}

	// The peer dies mid-chunk.
	if _, ok := tr.Size(key(28)); !ok {
		t.Fatal("chunk 28 is gone")
	}
	dst := bytes.Repeat([]byte{0xAA}, size)
	r, err = tr.OpenRange(ctx, key(28), dst)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.ReadRange(ctx, 0, size/2); err != nil {
		t.Fatal(err)
	}
	d1.kill()
	if err := r.ReadRange(ctx, size/2, size); err == nil {
		t.Fatal("a range read from a killed peer succeeded")
	}
	if !bytes.Equal(dst[:size/2], payload(28, size)[:size/2]) || !bytes.Equal(dst[size/2:], bytes.Repeat([]byte{0xAA}, size/2)) {
		t.Fatal("the range asked of a killed peer wrote bytes")
	}
}
