package fs

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"kvtier/codec"
	"kvtier/kvformat"
	"kvtier/tier"
	"kvtier/tier/remote"
)

// TestRangeReadsThroughTheStack stacks the fs tier as the engine does
// (breaker, envelope) over real files and reads a raw chunk a range at a
// time with ReadAt: the file is a pieced object; each range holds the
// stored bytes and only its pieces are read; a byte damaged in the file
// fails exactly the ranges of its piece and the whole Get; a version 1
// object is read whole; a missing file is not found, and a file removed
// between two ranges (swept, or cleared by another node) fails the second
// as a miss, not as corruption.
func TestRangeReadsThroughTheStack(t *testing.T) {
	ft := newTier(t, Config{})
	e := remote.Encode(remote.Guard(ft, remote.GuardOptions{Timeout: 10 * time.Second}), "fs", nil, nil)
	ctx := context.Background()
	chunk := randomBytes(300000, 21) // pieces of 4 KiB: 74 of them
	k := key(1)
	if err := e.Put(ctx, k, chunk); err != nil {
		t.Fatal(err)
	}
	path := ft.path(k)
	obj, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(obj) != codec.PiecedHeaderSize+len(chunk) || !bytes.Equal(obj[codec.PiecedHeaderSize:], chunk) {
		t.Fatalf("stored file of %d bytes is not the pieced chunk", len(obj))
	}
	if n, ok := e.Size(k); !ok || n != len(chunk) {
		t.Fatalf("Size = %d, %v", n, ok)
	}
	tail := make([]byte, 100)
	if n, err := ft.GetRange(ctx, k, len(obj)-40, tail); n != 40 || err != nil || !bytes.Equal(tail[:40], obj[len(obj)-40:]) {
		t.Fatalf("range over the end: %d, %v", n, err)
	}
	if n, err := ft.GetRange(ctx, k, len(obj)+5, tail); n != 0 || err != nil {
		t.Fatalf("range past the end: %d, %v", n, err)
	}

	dst := make([]byte, len(chunk))
	before := ft.Stats().BytesRead
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
	if got, want := ft.Stats().BytesRead-before, uint64(codec.PiecedHeaderSize+4096+4*4096+(300000-73*4096)); got != want {
		t.Fatalf("%d bytes read from the files, want %d", got, want)
	}

	// Damage piece 5 in the file.
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
	// The damaged object was removed at once, so that storing the chunk
	// again replaces it: a whole Get is a miss, and so is the next range
	// of the read still open (its file gone between two ranges).
	if _, err := e.Get(ctx, k, make([]byte, len(chunk))); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("whole Get of the removed damaged object: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("damaged file kept: %v", err)
	}
	if err := rr.ReadRange(ctx, 10*4096, 11*4096); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("range of a removed file: %v", err)
	}

	// A version 1 object, as kvtier wrote them before.
	raw, _ := codec.Lookup("raw")
	old, err := codec.Seal(nil, raw, kvformat.Spec{}, chunk)
	if err != nil {
		t.Fatal(err)
	}
	k1 := key(2)
	if err := ft.Put(ctx, k1, old); err != nil {
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
	if _, err := e.OpenRange(ctx, key(3), dst); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("missing key: %v", err)
	}
}
