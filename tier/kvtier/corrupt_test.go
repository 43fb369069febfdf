package kvtier_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/engine"
	"kvtier/tier"
	"kvtier/tier/remote"
)

// flipInRAM flips one byte, at off from the end, of each of keys' objects
// in eng's RAM, as a failing DIMM would: the daemon keeps answering and
// serves the damaged bytes as its own.
func flipInRAM(t *testing.T, eng *engine.Engine, keys []chunk.Key, off int) {
	t.Helper()
	ram := eng.Manager().RAM()
	ids := make([]arena.ID, len(keys))
	if n := ram.Acquire(keys, ids); n != len(keys) {
		t.Fatalf("the daemon holds %d of %d chunks", n, len(keys))
	}
	for _, id := range ids {
		b := ram.Arena().Bytes(id)
		b[len(b)-off] ^= 0x5a
		ram.Arena().Unref(id)
	}
}

// TestCorruptingDaemonIsCutOff: a kvtier:// daemon whose RAM damages what
// it holds answers its pings and serves every read in time, and every
// read fails the envelope's checksum. Those reads count against it apart
// from failures: after Threshold of them in a row its circuit opens (the
// damaged objects stay: the protocol has no per-key delete), and its
// pings do not close the circuit again within the corruption back-off
// (probes are held, none is sent). Every read is a miss, never wrong bytes. A read that verifies
// before any of this counts nothing.
func TestCorruptingDaemonIsCutOff(t *testing.T) {
	addr, eng, _ := remoteDaemon(t, "127.0.0.1:0")
	g := remote.Guard(open(t, "kvtier://"+token+"@"+addr), remote.GuardOptions{
		Threshold: 3, Timeout: 2 * time.Second, ProbeInterval: 5 * time.Millisecond})
	t.Cleanup(func() { g.Close() })
	e := remote.Encode(g, "kvtier", nil, nil)
	ctx := context.Background()
	const n, size = 6, 64 << 10
	keys := make([]chunk.Key, n)
	for i := range keys {
		keys[i] = key(200 + i)
		if err := e.Put(ctx, keys[i], payload(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	dst := make([]byte, size)
	if got, err := e.Get(ctx, keys[0], dst); err != nil || got != size || !bytes.Equal(dst, payload(0, size)) {
		t.Fatalf("read before the damage: %d, %v", got, err)
	}
	flipInRAM(t, eng, keys[1:], 100)
	for i := 1; i <= 3; i++ {
		clear(dst)
		if got, err := e.Get(ctx, keys[i], dst); !errors.Is(err, tier.ErrCorrupt) {
			t.Fatalf("read %d of a damaged object: %d, %v; want ErrCorrupt", i, got, err)
		}
		if !bytes.Equal(dst, make([]byte, size)) {
			t.Fatalf("read %d wrote damaged bytes into the buffer", i)
		}
	}
	h := g.Health()
	if h.State != remote.StateOpen || h.Corrupt != 3 || h.CorruptOpens != 1 || h.Failures != 0 {
		t.Fatalf("after 3 damaged reads in a row: %+v; want open for corruption", h)
	}
	// With the circuit open the next read is a miss that asks the daemon
	// nothing.
	if _, err := e.Get(ctx, keys[4], dst); !errors.Is(err, tier.ErrNotFound) || g.Health().FastFails == h.FastFails {
		t.Fatalf("read with the circuit open: %v, %+v; want a miss failed fast", err, g.Health())
	}
	// The daemon answers pings all along; the probe loop runs every 5 ms
	// but sends none within the back-off (30 s).
	deadline := time.Now().Add(20 * time.Second)
	for g.Health().ProbesHeld < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("probes never ran: %+v", g.Health())
		}
		time.Sleep(time.Millisecond)
	}
	if h := g.Health(); h.State != remote.StateOpen || h.ProbeOK != 0 {
		t.Fatalf("the circuit of a corrupting daemon was probed within its back-off: %+v", h)
	}
}
