package s3

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"kvtier/codec"
	"kvtier/kvformat"
	"kvtier/tier"
	"kvtier/tier/remote"
)

// stack wraps rt as the engine does: breaker, then envelope.
func stack(rt *Tier) *remote.Encoded {
	return remote.Encode(remote.Guard(rt, remote.GuardOptions{Timeout: 10 * time.Second}), "s3", nil, nil)
}

// TestRangeReadsThroughTheStack stacks the S3 tier as the engine does and
// reads a raw chunk a range at a time with HTTP Range GETs against
// versitygw: the object is pieced; each range holds the stored bytes and
// nothing else is fetched; a byte damaged in the server's file fails
// exactly the ranges of its piece and the whole Get; a version 1 object is
// read whole; a missing key is not found.
func TestRangeReadsThroughTheStack(t *testing.T) {
	srv := sharedServer(t)
	bucket := bucketName(t)
	rt := srv.open(t, bucket)
	e := stack(rt)
	ctx := context.Background()
	chunk := payload(11, 300000) // pieces of 4 KiB: 74 of them
	k := testKey(1)
	if err := e.Put(ctx, k, chunk); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(srv.root, bucket, filepath.FromSlash(objectName(rt.cfg.Prefix, k)))
	obj, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(obj) != codec.PiecedHeaderSize+len(chunk) || !bytes.Equal(obj[codec.PiecedHeaderSize:], chunk) {
		t.Fatalf("stored object of %d bytes is not the pieced chunk", len(obj))
	}
	if n, ok := e.Size(k); !ok || n != len(chunk) {
		t.Fatalf("Size = %d, %v", n, ok)
	}

	// The store's own range semantics: short at the end, empty past it.
	tail := make([]byte, 100)
	if n, err := rt.GetRange(ctx, k, len(obj)-40, tail); n != 40 || err != nil || !bytes.Equal(tail[:40], obj[len(obj)-40:]) {
		t.Fatalf("range over the end: %d, %v", n, err)
	}
	if n, err := rt.GetRange(ctx, k, len(obj), tail); n != 0 || err != nil {
		t.Fatalf("range past the end: %d, %v", n, err)
	}
	if n, err := rt.GetRange(ctx, testKey(9), 0, tail); n != 0 || err != nil {
		t.Fatalf("range of a missing object: %d, %v", n, err)
	}

	dst := make([]byte, len(chunk))
	before := rt.Stats().BytesRead
	rr, err := e.OpenRange(ctx, k, dst)
	if err != nil {
		t.Fatal(err)
	}
	for _, rg := range [][2]int{{0, 10}, {150000, 160000}, {299990, 300000}} {
		if err := rr.ReadRange(ctx, rg[0], rg[1]); err != nil {
			t.Fatalf("range %v: %v", rg, err)
		}
		if !bytes.Equal(dst[rg[0]:rg[1]], chunk[rg[0]:rg[1]]) {
			t.Fatalf("range %v: wrong bytes", rg)
		}
	}
	rr.Close()
	if bytes.Equal(dst[50000:60000], chunk[50000:60000]) {
		t.Fatal("bytes outside the ranges read were filled: the reads were not ranges")
	}
	// Header and table, one piece, four pieces, one short last piece.
	if got, want := rt.Stats().BytesRead-before, uint64(codec.PiecedHeaderSize+4096+4*4096+(300000-73*4096)); got != want {
		t.Fatalf("%d bytes read from S3, want %d", got, want)
	}

	// Damage piece 5 in the server's file.
	obj[codec.PiecedHeaderSize+5*4096+3] ^= 1
	if err := os.WriteFile(path, obj, 0o644); err != nil {
		t.Fatal(err)
	}
	dst = make([]byte, len(chunk))
	if rr, err = e.OpenRange(ctx, k, dst); err != nil {
		t.Fatal(err)
	}
	if err := rr.ReadRange(ctx, 0, 4096); err != nil || !bytes.Equal(dst[:4096], chunk[:4096]) {
		t.Fatalf("clean piece 0: %v", err)
	}
	if err := rr.ReadRange(ctx, 5*4096+100, 5*4096+200); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("damaged piece 5: %v", err)
	}
	// The damaged object is removed (was: kept, and since Put keeps an
	// existing object, it never healed and kept counting against S3):
	// the next read misses and storing the chunk again heals it.
	if _, err := e.Get(ctx, k, make([]byte, len(chunk))); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("whole Get after the damaged object was found: %v, want a miss", err)
	}
	if err := e.Put(ctx, k, chunk); err != nil {
		t.Fatal(err)
	}
	if n, err := e.Get(ctx, k, dst); err != nil || n != len(chunk) || !bytes.Equal(dst, chunk) {
		t.Fatalf("Get after storing the chunk again: %d, %v", n, err)
	}

	// A version 1 object, as kvtier wrote them to S3 before.
	raw, _ := codec.Lookup("raw")
	old, err := codec.Seal(nil, raw, kvformat.Spec{}, chunk)
	if err != nil {
		t.Fatal(err)
	}
	k1 := testKey(2)
	if err := rt.Put(ctx, k1, old); err != nil {
		t.Fatal(err)
	}
	if n, ok := e.Size(k1); !ok || n != len(chunk) {
		t.Fatalf("Size of a version 1 object = %d, %v", n, ok)
	}
	dst = make([]byte, len(chunk))
	if rr, err = e.OpenRange(ctx, k1, dst); err != nil {
		t.Fatal(err)
	}
	if err := rr.ReadRange(ctx, 100, 200); err != nil || !bytes.Equal(dst, chunk) {
		t.Fatalf("version 1 object read by range: %v", err)
	}
	if _, err := e.OpenRange(ctx, testKey(3), dst); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("missing key: %v", err)
	}
}

// TestRangeReadServerKilled kills versitygw between two range reads of a
// chunk: the second fails with an error that is neither a miss nor
// corruption, and leaves the bytes it did not read alone.
func TestRangeReadServerKilled(t *testing.T) {
	srv := startServer(t)
	rt := srv.open(t, bucketName(t))
	e := stack(rt)
	ctx := context.Background()
	chunk := payload(12, 1<<20)
	k := testKey(1)
	if err := e.Put(ctx, k, chunk); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, len(chunk))
	rr, err := e.OpenRange(ctx, k, dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := rr.ReadRange(ctx, 0, 64<<10); err != nil || !bytes.Equal(dst[:64<<10], chunk[:64<<10]) {
		t.Fatalf("first range: %v", err)
	}
	srv.kill()
	err = rr.ReadRange(ctx, 512<<10, 576<<10)
	if err == nil || errors.Is(err, tier.ErrCorrupt) || errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("range read with the server gone: %v", err)
	}
	if bytes.Equal(dst[512<<10:576<<10], chunk[512<<10:576<<10]) {
		t.Fatal("the failed range holds the chunk's bytes")
	}
}
