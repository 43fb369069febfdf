package tier_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
)

// peerTier stands for the P2P tier: it holds chunks that live elsewhere
// and counts the writes it is offered, which must be none.
type peerTier struct {
	*bareTier
	puts atomic.Int64
}

func (p *peerTier) ReadOnly() {}

func (p *peerTier) Put(context.Context, chunk.Key, []byte) error {
	p.puts.Add(1)
	return nil
}

func TestReadOnlyTierIsNeverWritten(t *testing.T) {
	ram := newRAM(t, 1<<20)
	d := newDisk(t, t.TempDir(), 8<<20)
	peer := &peerTier{bareTier: newBare()}
	below := newBare() // a remote store under the peer tier
	m, err := tier.NewManager(ram, []tier.Tier{d, peer, below}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	// A store goes to disk and the remote store, not to the peer tier.
	if n, err := m.Store(ctx, []chunk.Key{key(1)}, [][]byte{payload(1, 1000)}); err != nil || n != 1 {
		t.Fatalf("Store = %d, %v", n, err)
	}
	// A hit in the remote store is promoted into RAM and offered to the
	// tiers above it: disk takes it, the peer tier is skipped.
	below.Put(ctx, key(2), payload(2, 1000))
	dst := [][]byte{make([]byte, 1000)}
	if n, err := m.Retrieve(ctx, []chunk.Key{key(2)}, dst); err != nil || n != 1 || !bytes.Equal(dst[0], payload(2, 1000)) {
		t.Fatalf("Retrieve = %d, %v", n, err)
	}
	// A peer hit is promoted like any lower-tier hit.
	peer.bareTier.Put(ctx, key(3), payload(3, 1000))
	if n, err := m.Retrieve(ctx, []chunk.Key{key(3)}, dst); err != nil || n != 1 || !bytes.Equal(dst[0], payload(3, 1000)) {
		t.Fatalf("Retrieve from the peer tier = %d, %v", n, err)
	}
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := peer.puts.Load(); got != 0 {
		t.Fatalf("the read-only tier was written %d times", got)
	}
	for _, k := range []chunk.Key{key(1), key(2), key(3)} {
		if !tier.Contains(d, k) {
			t.Errorf("disk lacks %v", k)
		}
	}
}

func TestLocalReadsSkipPeersAndRemotes(t *testing.T) {
	ram := newRAM(t, 1<<20)
	d := newDisk(t, t.TempDir(), 8<<20)
	peer := &peerTier{bareTier: newBare()}
	below := newBare()
	m, err := tier.NewManager(ram, []tier.Tier{d, peer, below}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	if err := d.Put(ctx, key(1), payload(1, 500)); err != nil {
		t.Fatal(err)
	}
	peer.bareTier.Put(ctx, key(2), payload(2, 500))
	below.Put(ctx, key(3), payload(3, 500))
	keys := []chunk.Key{key(1), key(2), key(3)}
	if n, _, _ := m.Lookup(keys); n != 3 {
		t.Fatalf("Lookup = %d, want 3", n)
	}
	if n, _, _ := m.LookupLocal(keys); n != 1 {
		t.Fatalf("LookupLocal = %d, want 1 (disk only)", n)
	}
	if _, ok := m.SizeLocal(key(2)); ok {
		t.Fatal("SizeLocal found a peer's chunk")
	}
	ids := make([]arena.ID, 3)
	n, err := m.AcquireLocal(ctx, keys, ids)
	if err != nil || n != 1 {
		t.Fatalf("AcquireLocal = %d, %v; want 1", n, err)
	}
	m.RAM().Arena().Unref(ids[0])
}
