package fs

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"kvtier/tier"
	"kvtier/tier/remote"
)

// TestDamagedFileIsRemovedAndCounted: a byte flipped in an object's file
// on disk (stacked as the engine stacks a remote tier: envelope over
// breaker over the directory) makes its read a miss with ErrCorrupt,
// counted by the breaker as a read that failed verification, and the
// file is removed, so that reading it again is a plain miss rather than
// another damaged read, and storing the chunk again stores it whole. One
// damaged object does not open the circuit.
func TestDamagedFileIsRemovedAndCounted(t *testing.T) {
	tr := newTier(t, Config{})
	g := remote.Guard(tr, remote.GuardOptions{Threshold: 2, Timeout: 10 * time.Second, ProbeInterval: time.Hour, Logger: quiet})
	t.Cleanup(func() { g.Close() })
	e := remote.Encode(g, "fs", nil, nil)
	ctx := context.Background()
	k, data := key(9), randomBytes(100_000, 9)
	if err := e.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(tr.path(k))
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-7] ^= 0x01
	if err := os.WriteFile(tr.path(k), b, 0o644); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, len(data))
	if _, err := e.Get(ctx, k, dst); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("read of a damaged file: %v, want ErrCorrupt", err)
	}
	if _, err := os.Stat(tr.path(k)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("damaged file kept: %v", err)
	}
	for range 3 {
		if _, err := e.Get(ctx, k, dst); !errors.Is(err, tier.ErrNotFound) {
			t.Fatalf("read after the removal: %v, want a miss", err)
		}
	}
	if h := g.Health(); h.State != remote.StateClosed || h.Corrupt != 1 || h.CorruptOpens != 0 {
		t.Fatalf("breaker after one damaged object: %+v", h)
	}
	if err := e.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	if n, err := e.Get(ctx, k, dst); err != nil || n != len(data) || !bytes.Equal(dst, data) {
		t.Fatalf("stored again: %d, %v", n, err)
	}
	if s := e.Stats(); s.Corrupt != 1 {
		t.Fatalf("corrupt count %d, want 1", s.Corrupt)
	}
}
