package p2p

import (
	"context"

	"kvtier/chunk"
	"kvtier/tier/remote"
)

// Static is a Resolver over a fixed list of peers: it asks every peer
// with one LOOKUP (as a peer client, so each answers from its own RAM and
// disk), all at once, and lists, for each key, the peers whose hit
// covers it, in list order. A peer behind an open circuit is not asked.
// It needs no controller, which suits small fleets and tests; its cost
// grows with the number of peers, its time does not: a lookup takes the
// slowest healthy peer's round trip, at most the round-trip deadline.
type Static struct {
	addrs []string
	peers *peers
}

// Holders implements Resolver.
func (s *Static) Holders(ctx context.Context, keys []chunk.Key) ([][]Peer, error) {
	type hit struct{ peer, n int }
	hits := make(chan hit, len(s.addrs))
	asked := 0
	for i, addr := range s.addrs {
		g := s.peers.get(addr)
		if g.Health().State == remote.StateOpen {
			continue
		}
		asked++
		// The guard bounds each call by the round-trip deadline, even
		// against a peer that never answers.
		go func() { hits <- hit{i, g.PrefixContains(keys)} }()
	}
	counts := make([]int, len(s.addrs))
	for ; asked > 0; asked-- {
		select {
		case h := <-hits:
			counts[h.peer] = h.n
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	out := make([][]Peer, len(keys))
	for i, addr := range s.addrs {
		for k := range min(counts[i], len(keys)) {
			out[k] = append(out[k], Peer{Addr: addr})
		}
	}
	return out, nil
}

// ResolverFunc adapts a function to Resolver.
type ResolverFunc func(ctx context.Context, keys []chunk.Key) ([][]Peer, error)

// Holders implements Resolver.
func (f ResolverFunc) Holders(ctx context.Context, keys []chunk.Key) ([][]Peer, error) {
	return f(ctx, keys)
}

// FromLookup is the hook for the controller's cluster index: it makes a
// Resolver of a batched lookup keyed by a u64 chunk id (the index keys
// chunks by id, not by whole key), given the function that derives a
// chunk's id. The lookup's holder type is any struct of exactly the three
// fields of Peer, without struct tags: cluster.Holder carries JSON tags,
// so a caller converts each holder (a conversion ignores tags), as the
// daemon does in cmd/kvtier:
//
//	res := p2p.FromLookup(chunk.Key.Index, lookupAsPeers)
func FromLookup[H ~struct{ Instance, Addr, Tier string }](id func(chunk.Key) uint64,
	lookup func(ctx context.Context, ids []uint64) ([][]H, error)) Resolver {
	return ResolverFunc(func(ctx context.Context, keys []chunk.Key) ([][]Peer, error) {
		ids := make([]uint64, len(keys))
		for i, k := range keys {
			ids[i] = id(k)
		}
		hs, err := lookup(ctx, ids)
		if err != nil {
			return nil, err
		}
		out := make([][]Peer, len(hs))
		for i, row := range hs {
			out[i] = make([]Peer, len(row))
			for j, h := range row {
				out[i][j] = Peer(h)
			}
		}
		return out, nil
	})
}
