package replay

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"kvtier/router/index"
)

func simulateNodes(t *testing.T, reqs []Request, cfg NodesConfig) NodesResult {
	t.Helper()
	if cfg.Policy == "" {
		cfg.Policy = "LRU"
	}
	if cfg.Scorer == "" {
		cfg.Scorer = index.ScorerLongestPrefix
	}
	res, err := SimulateNodes(context.Background(), reqs, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkAccounting(t, reqs, res)
	return res
}

// checkAccounting checks that every prompt token is counted once: the
// sources add up to the prompt tokens and their fractions to 1.
func checkAccounting(t *testing.T, reqs []Request, res NodesResult) {
	t.Helper()
	var tokens, sum int64
	for _, r := range reqs {
		tokens += int64(r.InputLength)
	}
	frac := 0.0
	for i, v := range res.ByTier {
		sum += v
		frac += res.Fractions[i]
	}
	if res.Tokens != tokens || sum != tokens {
		t.Errorf("%d prompt tokens counted, %d by source, want %d", res.Tokens, sum, tokens)
	}
	if math.Abs(frac-1) > 1e-9 {
		t.Errorf("fractions sum to %v, want 1", frac)
	}
	if res.PeerRAM+res.PeerDisk != res.ByTier[SourcePeer] {
		t.Errorf("peer RAM %d + disk %d != peer %d", res.PeerRAM, res.PeerDisk, res.ByTier[SourcePeer])
	}
	requests := 0
	for _, n := range res.NodeRequests {
		requests += n
	}
	if res.Requests != len(reqs) || requests != len(reqs) {
		t.Errorf("%d requests, %d routed, want %d", res.Requests, requests, len(reqs))
	}
}

// TestNodesOneNodeIsSimulate checks that one node with only a RAM tier is
// the single-cache simulator: same policy, same hits, no peer column.
func TestNodesOneNodeIsSimulate(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 20 {
		reqs := randomTrace(rng, 50+rng.IntN(100), 10+rng.IntN(50))
		capacity := 3 + rng.IntN(20)
		for _, p2p := range []bool{false, true} {
			res := simulateNodes(t, reqs, NodesConfig{Nodes: 1, RAMBlocks: capacity, P2P: p2p})
			want, err := Simulate(reqs, "LRU", capacity)
			if err != nil {
				t.Fatal(err)
			}
			if res.ByTier[SourceRAM] != want.HitTokens {
				t.Errorf("trial %d: one node hits %d tokens in RAM, Simulate %d", trial, res.ByTier[SourceRAM], want.HitTokens)
			}
			if res.ByTier[SourcePeer] != 0 || res.ByTier[SourceDisk] != 0 || res.ByTier[SourceRemote] != 0 {
				t.Errorf("trial %d: one RAM-only node served %v", trial, res.ByTier)
			}
		}
	}
}

// TestNodesOneNodeNoPeer: with a disk tier and a remote store, one node
// still has no peer to ask.
func TestNodesOneNodeNoPeer(t *testing.T) {
	reqs := randomTrace(rand.New(rand.NewPCG(5, 6)), 300, 80)
	res := simulateNodes(t, reqs, NodesConfig{Nodes: 1, RAMBlocks: 5, DiskBlocks: 20, RemoteBlocks: 40, P2P: true})
	if res.ByTier[SourcePeer] != 0 {
		t.Errorf("one node served %d tokens from a peer", res.ByTier[SourcePeer])
	}
	if res.ByTier[SourceDisk] == 0 || res.ByTier[SourceRemote] == 0 {
		t.Errorf("expected disk and remote hits on a tight RAM tier: %v", res.ByTier)
	}
}

// TestNodesP2PNeverMissesWhatTheClusterHolds: when no tier ever evicts, a
// block is held somewhere in the cluster from its first reference on, so
// with P2P only first references miss, the fewest possible.
func TestNodesP2PNeverMissesWhatTheClusterHolds(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for trial := range 10 {
		reqs := randomTrace(rng, 100+rng.IntN(200), 20+rng.IntN(80))
		inf := SimulateInfinite(reqs)
		big := NodesConfig{Nodes: 2 + rng.IntN(4), RAMBlocks: 1 << 12}
		off := simulateNodes(t, reqs, big)
		big.P2P = true
		on := simulateNodes(t, reqs, big)
		if miss := on.Tokens - on.ByTier[SourceMiss]; miss != inf.HitTokens {
			t.Errorf("trial %d: with P2P %d tokens hit, the infinite cache %d", trial, miss, inf.HitTokens)
		}
		if on.ByTier[SourceMiss] > off.ByTier[SourceMiss] {
			t.Errorf("trial %d: P2P raised misses from %d to %d", trial, off.ByTier[SourceMiss], on.ByTier[SourceMiss])
		}
		if off.ByTier[SourcePeer] != 0 {
			t.Errorf("trial %d: %d peer tokens without P2P", trial, off.ByTier[SourcePeer])
		}
	}
}

// TestNodesP2PTightTiers runs a seeded cluster whose tiers evict, under
// every routing and scorer, and logs the sources. Routed by the default
// scorer, peers serve some of what the chosen node lacks and misses do not
// rise. Round robin ignores the cache, so peers serve much more. Other
// configurations may see misses rise slightly: promoting pulled blocks
// into a full RAM tier can displace a block a later request needed, and
// under kvtier+load the changed service times change the routing.
func TestNodesP2PTightTiers(t *testing.T) {
	reqs := randomTrace(rand.New(rand.NewPCG(11, 12)), 2000, 400)
	for _, routing := range NodesRoutings {
		for _, scorer := range index.ScorerNames() {
			if routing == RouteRoundRobin && scorer != index.ScorerLongestPrefix {
				continue // round robin asks no scorer
			}
			cfg := NodesConfig{Nodes: 4, RAMBlocks: 15, DiskBlocks: 40, RemoteBlocks: 60, Scorer: scorer, Routing: routing}
			off := simulateNodes(t, reqs, cfg)
			cfg.P2P = true
			on := simulateNodes(t, reqs, cfg)
			t.Logf("%-12s %-14s without P2P %.4f, with %.4f", routing, scorer, off.Fractions, on.Fractions)
			if off.ByTier[SourcePeer] != 0 {
				t.Errorf("%s %s: %d peer tokens without P2P", routing, scorer, off.ByTier[SourcePeer])
			}
			if scorer != index.ScorerLongestPrefix || routing == RouteKVTierLoad {
				continue
			}
			if on.ByTier[SourcePeer] == 0 {
				t.Errorf("%s %s: no peer hits: %+v", routing, scorer, on)
			}
			if on.ByTier[SourceMiss] > off.ByTier[SourceMiss] {
				t.Errorf("%s %s: P2P raised misses from %d to %d tokens", routing, scorer, off.ByTier[SourceMiss], on.ByTier[SourceMiss])
			}
			if routing == RouteRoundRobin && on.Fractions[SourcePeer] < 0.05 {
				t.Errorf("round robin: peers served only %.4f of the tokens", on.Fractions[SourcePeer])
			}
		}
	}
}

// TestNodesLoadSpreads: a prefix every request shares sends them all to
// one node under kvtier routing; kvtier+load spreads them.
func TestNodesLoadSpreads(t *testing.T) {
	var chains [][]uint64
	for i := range 400 {
		chains = append(chains, []uint64{1, uint64(1000 + i%40), uint64(2000 + i)})
	}
	reqs := requests(chains...)
	for i := range reqs {
		reqs[i].Timestamp = int64(i * 100) // 10 requests a second
		reqs[i].OutputLength = 500         // 10 s each at 50 tokens/s
	}
	cfg := NodesConfig{Nodes: 4, RAMBlocks: 100}
	hot := simulateNodes(t, reqs, cfg)
	cfg.Routing = RouteKVTierLoad
	spread := simulateNodes(t, reqs, cfg)
	if hot.NodeRequests[0] != len(reqs) {
		t.Errorf("kvtier routing: %v, want every request on the node holding the shared prefix", hot.NodeRequests)
	}
	for i, n := range spread.NodeRequests {
		if n == 0 {
			t.Errorf("kvtier+load left node %d idle: %v", i, spread.NodeRequests)
		}
	}
}

func TestNodesDeterministic(t *testing.T) {
	reqs := randomTrace(rand.New(rand.NewPCG(13, 14)), 500, 100)
	cfg := NodesConfig{Nodes: 3, RAMBlocks: 10, DiskBlocks: 20, P2P: true}
	a, b := simulateNodes(t, reqs, cfg), simulateNodes(t, reqs, cfg)
	if a.ByTier != b.ByTier {
		t.Errorf("two runs differ: %v and %v", a.ByTier, b.ByTier)
	}
}

func TestNodesConfigErrors(t *testing.T) {
	reqs := requests([]uint64{1})
	for _, cfg := range []NodesConfig{
		{Nodes: 0, RAMBlocks: 1, Policy: "LRU", Scorer: index.ScorerLongestPrefix},
		{Nodes: 1, RAMBlocks: 0, Policy: "LRU", Scorer: index.ScorerLongestPrefix},
		{Nodes: 1, RAMBlocks: 1, DiskBlocks: -1, Policy: "LRU", Scorer: index.ScorerLongestPrefix},
		{Nodes: 1, RAMBlocks: 1, Policy: "nope", Scorer: index.ScorerLongestPrefix},
		{Nodes: 1, RAMBlocks: 1, Policy: "LRU", Scorer: "nope"},
		{Nodes: 1, RAMBlocks: 1, Policy: "LRU", Scorer: index.ScorerLongestPrefix, Routing: "nope"},
		{Nodes: 1, RAMBlocks: 1, Policy: "LRU", Scorer: index.ScorerLongestPrefix, LoadWeight: -1},
	} {
		if _, err := SimulateNodes(context.Background(), reqs, cfg, nil); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
	}
}
