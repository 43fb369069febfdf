package redis

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"kvtier/codec"
	"kvtier/kvformat"
	"kvtier/tier"
	"kvtier/tier/remote"
)

// TestRangeReadsThroughTheStack stacks the Redis tier as the engine does
// (breaker, envelope) and reads a raw chunk a range at a time with
// GETRANGE: each range holds the stored bytes; a byte damaged in Redis
// fails exactly the ranges of its piece; a version 1 object written before
// pieces existed is read whole; a missing key is not found.
func TestRangeReadsThroughTheStack(t *testing.T) {
	srv := sharedServer(t)
	rt := openTier(t, srv.url(""))
	e := remote.Encode(remote.Guard(rt, remote.GuardOptions{Timeout: 10 * time.Second}), "redis", nil, nil)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(7, 8))
	chunk := make([]byte, 300000) // pieces of 4 KiB: 74 of them
	for i := range chunk {
		chunk[i] = byte(r.Uint32())
	}
	k := testKey(91, 1)
	if err := e.Put(ctx, k, chunk); err != nil {
		t.Fatal(err)
	}
	if n, ok := e.Size(k); !ok || n != len(chunk) {
		t.Fatalf("Size = %d, %v", n, ok)
	}
	dst := make([]byte, len(chunk))
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

	// Damage piece 5 in Redis itself.
	at := int64(codec.PiecedHeaderSize + 5*4096 + 3)
	if err := srv.rawClient().SetRange(ctx, rt.keyName(k), at, string([]byte{^chunk[5*4096+3]})).Err(); err != nil {
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
	// again replaces it (SET NX would keep it otherwise).
	if _, err := e.Get(ctx, k, make([]byte, len(chunk))); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("whole Get of the removed damaged object: %v", err)
	}
	if n, err := srv.rawClient().Exists(ctx, rt.keyName(k)).Result(); err != nil || n != 0 {
		t.Fatalf("damaged object kept in Redis: %d, %v", n, err)
	}

	// A version 1 object, as kvtier wrote them before pieced objects.
	raw, _ := codec.Lookup("raw")
	old, err := codec.Seal(nil, raw, kvformat.Spec{}, chunk)
	if err != nil {
		t.Fatal(err)
	}
	k1 := testKey(91, 2)
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
	if _, err := e.OpenRange(ctx, testKey(91, 3), dst); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("missing key: %v", err)
	}
}
