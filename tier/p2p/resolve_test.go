package p2p_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"kvtier/chunk"
	"kvtier/engine"
	"kvtier/tier/p2p"
)

// holder has the shape of the controller's answer: the cluster package's
// own type, not Peer.
type holder struct{ Instance, Addr, Tier string }

// TestLookupResolverFindsHolders runs the P2P tier on a resolver built
// from a batched id lookup, as the controller's index will be: only the
// peer it names is asked, and a lookup that fails is a miss.
func TestLookupResolverFindsHolders(t *testing.T) {
	d1 := startDaemon(t, "127.0.0.1:0", engine.Options{})
	store(t, d1, 4, 20_000)
	idOf := func(k chunk.Key) uint64 { return uint64(k.Hash[0]) | uint64(k.Hash[1])<<8 }
	held := map[uint64]bool{0: true, 1: true, 2: true, 3: true}
	var down atomic.Bool
	lookup := func(_ context.Context, ids []uint64) ([][]holder, error) {
		if down.Load() {
			return nil, errors.New("controller unreachable")
		}
		out := make([][]holder, len(ids))
		for i, id := range ids {
			if held[id] {
				out[i] = []holder{{Instance: "d1", Addr: d1.addr, Tier: "mem"}}
			}
		}
		return out, nil
	}
	d2 := startDaemon(t, "127.0.0.1:0", engine.Options{P2PResolver: p2p.FromLookup(idOf, lookup), P2PToken: token})
	if n, by := d2.eng.LookupKeys(keysOf(6)); n != 4 || by[1] != 4 {
		t.Fatalf("lookup = %d, by tier %v; want 4 from p2p", n, by)
	}
	if got := retrieve(t, d2, 2, 20_000); got != 2 {
		t.Fatalf("retrieved %d of 2", got)
	}
	down.Store(true)
	if n, _ := d2.eng.LookupKeys(keysOf(6)); n != 2 {
		t.Fatalf("with the controller down: lookup = %d, want the 2 already promoted", n)
	}
	if got := retrieve(t, d2, 4, 20_000); got != 2 {
		t.Fatalf("with the controller down: retrieved %d, want the 2 already promoted", got)
	}
}

// TestSizeUsesTheHoldersALookupListed checks that a LOOKUP then a
// RETRIEVE of n chunks asks a resolver once, not once more per chunk:
// with the controller's resolver each ask is an HTTP round trip.
func TestSizeUsesTheHoldersALookupListed(t *testing.T) {
	d1 := startDaemon(t, "127.0.0.1:0", engine.Options{})
	store(t, d1, 4, 20_000)
	var calls atomic.Int32
	res := p2p.ResolverFunc(func(_ context.Context, keys []chunk.Key) ([][]p2p.Peer, error) {
		calls.Add(1)
		out := make([][]p2p.Peer, len(keys))
		for i := range keys {
			out[i] = []p2p.Peer{{Instance: "d1", Addr: d1.addr}}
		}
		return out, nil
	})
	d2 := startDaemon(t, "127.0.0.1:0", engine.Options{P2PResolver: res, P2PToken: token})
	if n, by := d2.eng.LookupKeys(keysOf(4)); n != 4 || by[1] != 4 {
		t.Fatalf("lookup = %d, by tier %v; want 4 from p2p", n, by)
	}
	if got := retrieve(t, d2, 4, 20_000); got != 4 {
		t.Fatalf("retrieved %d of 4", got)
	}
	if c := calls.Load(); c != 1 {
		t.Fatalf("the resolver was asked %d times for a lookup and a retrieve of 4 chunks, want 1", c)
	}
}
