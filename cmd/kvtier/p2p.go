package main

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"kvtier/chunk"
	"kvtier/cluster"
	"kvtier/config"
	"kvtier/tier/p2p"
	"kvtier/tier/remote"
)

// controllerPeers finds the P2P tier's holders through the controller's
// cluster lookup. Its own identity is known only once the TCP listener is
// bound (tcp_addr may have port 0 and the default instance id names the
// port), so it is set after the engine opens; no lookup runs before then,
// since no client is served yet.
type controllerPeers struct {
	client  *cluster.Client
	timeout time.Duration
	self    atomic.Pointer[selfID]
}

// selfID is how the controller may name this daemon in a lookup.
type selfID struct{ instance, addr string }

// p2pResolver returns the controller resolver when the P2P tier is to
// find peers through the controller: enable_p2p and controller_url set,
// and no p2p_peers, whose fixed list wins when given (it pins the peers
// even in a cluster). nil otherwise.
func p2pResolver(cfg config.Config, log *slog.Logger) *controllerPeers {
	if !cfg.EnableP2P || cfg.ControllerURL == "" {
		return nil
	}
	if len(cfg.P2PPeers) > 0 {
		log.Info("p2p tier asks the listed p2p_peers, not the controller", "peers", cfg.P2PPeers)
		return nil
	}
	bases, err := cfg.ControllerBases()
	if err != nil {
		return nil // validation reports controller_url
	}
	timeout := cfg.RemoteTimeout
	if timeout <= 0 {
		timeout = remote.DefaultTimeout
	}
	// The client's own timeout is a backstop: each call already carries
	// its deadline.
	hc := &http.Client{Timeout: 4 * timeout}
	log.Info("p2p tier finds peers through the controller", "controllers", bases, "timeout", timeout)
	return &controllerPeers{client: cluster.NewFailoverClient(bases, hc), timeout: timeout}
}

// setSelf names this daemon, so that lookups never list it.
func (r *controllerPeers) setSelf(instance, addr string) {
	r.self.Store(&selfID{instance: instance, addr: addr})
}

// resolver adapts the controller's lookup to the P2P tier, keyed by the
// index key the controller's index is keyed by.
func (r *controllerPeers) resolver() p2p.Resolver {
	return p2p.FromLookup(chunk.Key.Index, r.lookup)
}

// lookup asks the controller for the holders of ids, at most
// cluster.MaxLookupKeys at a time, each call bounded by the remote
// timeout: a slow controller costs a miss, not a stalled read.
func (r *controllerPeers) lookup(ctx context.Context, ids []uint64) ([][]p2p.Peer, error) {
	out := make([][]p2p.Peer, 0, len(ids))
	for len(ids) > 0 {
		n := min(len(ids), cluster.MaxLookupKeys)
		hs, err := r.lookupBatch(ctx, ids[:n])
		if err != nil {
			return nil, err
		}
		for _, row := range hs {
			out = append(out, r.peers(row))
		}
		ids = ids[n:]
	}
	return out, nil
}

func (r *controllerPeers) lookupBatch(ctx context.Context, ids []uint64) ([][]cluster.Holder, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	return r.client.Lookup(ctx, ids)
}

// peers converts one key's holders to peers: this daemon left out, RAM
// holders before disk ones (a RAM read is cheaper on the peer), each
// daemon once (one holding in RAM and on disk is one peer to ask), and
// the controller's tier names turned into the daemon's.
func (r *controllerPeers) peers(hs []cluster.Holder) []p2p.Peer {
	self := r.self.Load()
	out := make([]p2p.Peer, 0, len(hs))
	for _, h := range hs {
		if self != nil && (h.Instance == self.instance || h.Addr == self.addr) {
			continue
		}
		// cluster.Holder carries JSON tags, so it does not meet
		// FromLookup's constraint; a conversion ignores tags.
		p := p2p.Peer(h)
		if p.Tier == "cpu" {
			p.Tier = "mem"
		}
		out = append(out, p)
	}
	slices.SortStableFunc(out, func(a, b p2p.Peer) int { return tierRank(a.Tier) - tierRank(b.Tier) })
	return dedupAddr(out)
}

// dedupAddr keeps the first peer of each address, in order.
func dedupAddr(ps []p2p.Peer) []p2p.Peer {
	out := ps[:0]
	for _, p := range ps {
		if !slices.ContainsFunc(out, func(q p2p.Peer) bool { return q.Addr == p.Addr }) {
			out = append(out, p)
		}
	}
	return out
}

func tierRank(tier string) int {
	if tier == "mem" {
		return 0
	}
	return 1
}
