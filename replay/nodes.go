package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"kvtier/router/index"
	"kvtier/tier/policy"
)

// NodesConfig describes a simulated kvtier cluster for SimulateNodes.
type NodesConfig struct {
	Nodes        int    // kvtier nodes, 1 to 1024
	RAMBlocks    int    // each node's RAM tier, in trace blocks
	DiskBlocks   int    // each node's disk tier, in trace blocks; 0: none
	RemoteBlocks int    // the shared remote store, in trace blocks; 0: none
	Policy       string // eviction policy of every tier (policy.New names)
	Scorer       string // the controller's scorer (index.NewScorer names)
	P2P          bool   // a local miss may be served by a peer's RAM or disk
	// Routing is RouteKVTier (the default: by Scorer alone),
	// RouteKVTierLoad (Scorer's share of the prompt minus LoadWeight per
	// request in flight, as the router's load-aware policy) or
	// RouteRoundRobin, the cache-blind baseline.
	Routing string
	// Service-time model for load, as in RouteConfig: a request stays in
	// flight for its recomputed prompt tokens at PrefillRate plus its
	// output tokens at DecodeRate (defaults 10000 and 50 tokens/s).
	PrefillRate, DecodeRate float64
	LoadWeight              float64 // default 0.05
}

// NodesRoutings lists the routings SimulateNodes accepts, default first.
var NodesRoutings = []string{RouteKVTier, RouteKVTierLoad, RouteRoundRobin}

func (c *NodesConfig) check() error {
	switch {
	case c.Nodes < 1 || c.Nodes > 1024:
		return fmt.Errorf("nodes: %d nodes, want 1 to 1024", c.Nodes)
	case c.RAMBlocks < 1:
		return fmt.Errorf("nodes: %d RAM blocks per node, want at least 1", c.RAMBlocks)
	case c.DiskBlocks < 0 || c.RemoteBlocks < 0:
		return fmt.Errorf("nodes: negative disk (%d) or remote (%d) capacity", c.DiskBlocks, c.RemoteBlocks)
	case c.PrefillRate < 0 || c.DecodeRate < 0 || c.LoadWeight < 0:
		return errors.New("nodes: negative prefill rate, decode rate or load weight")
	}
	c.PrefillRate = cmp.Or(c.PrefillRate, 10_000)
	c.DecodeRate = cmp.Or(c.DecodeRate, 50)
	c.LoadWeight = cmp.Or(c.LoadWeight, 0.05)
	if c.Routing == "" {
		c.Routing = RouteKVTier
	}
	if !slices.Contains(NodesRoutings, c.Routing) {
		return fmt.Errorf("nodes: unknown routing %q (want one of %v)", c.Routing, NodesRoutings)
	}
	if _, err := policy.New[uint64](c.Policy); err != nil {
		return fmt.Errorf("nodes: %w", err)
	}
	if _, err := index.NewScorer(c.Scorer); err != nil {
		return fmt.Errorf("nodes: %w", err)
	}
	return nil
}

// Where a prompt block was found, in the order a node's waterfall asks.
const (
	SourceRAM = iota
	SourceDisk
	SourcePeer
	SourceRemote
	SourceMiss // recomputed
	numSources
)

// SourceNames names the sources in report order.
var SourceNames = [numSources]string{"local RAM", "local disk", "peer", "remote", "miss"}

// NodesResult is one cluster simulation's outcome.
type NodesResult struct {
	Routing  string `json:"routing"`
	P2P      bool   `json:"p2p"`
	Requests int    `json:"requests"`
	Tokens   int64  `json:"prompt_tokens"`
	// ByTier counts prompt tokens by where they came from, indexed by
	// Source*; Fractions divides them by Tokens, so they sum to 1.
	ByTier    [numSources]int64   `json:"tokens_by_source"`
	Fractions [numSources]float64 `json:"fractions"`
	// PeerRAM and PeerDisk split the peer tokens by the tier the peer
	// served them from.
	PeerRAM      int64 `json:"peer_ram_tokens"`
	PeerDisk     int64 `json:"peer_disk_tokens"`
	NodeRequests []int `json:"node_requests"`
}

// HitRate is the share of prompt tokens not recomputed.
func (r NodesResult) HitRate() float64 { return 1 - r.Fractions[SourceMiss] }

// SimulateNodes replays reqs over a cluster of kvtier nodes. Each node has
// a RAM tier and optionally a disk tier, both written through (every block
// a node stores or pulls lands in each of its tiers, as the daemon's
// manager queues stores and promotions for every writable tier), and a
// remote store may be shared by all of them.
//
// Each request is routed by the controller's scorer (cfg.Scorer) run on a
// router index that holds every node's RAM blocks as CPU and disk blocks
// as Disk, kept exact as tiers admit and evict: the node with the highest
// score wins, ties going round robin so an empty cluster spreads its
// first requests. Under RouteKVTier with a prefix scorer that node
// already holds the longest cached prefix in the cluster, so P2P can only
// add blocks a peer holds past a hole in its own prefix; it pays when
// routing trades the cache for load (RouteKVTierLoad) or ignores it
// (RouteRoundRobin). The chosen node then looks up the prompt block by block
// down its waterfall — local RAM, local disk, a peer's RAM then disk (with
// P2P), the remote store — and the first block found nowhere ends the
// prefix: it and everything after it are recomputed. Every tier's policy
// sees an access only from the tier that served a block, and the
// request's blocks are pinned while it stores them, as in Simulate.
func SimulateNodes(ctx context.Context, reqs []Request, cfg NodesConfig, progress func(done, total int)) (NodesResult, error) {
	if err := cfg.check(); err != nil {
		return NodesResult{}, err
	}
	for r := range reqs {
		if err := reqs[r].validate(); err != nil {
			return NodesResult{}, fmt.Errorf("nodes: request %d: %w", r, err)
		}
	}
	s, err := newNodesSim(compile(reqs), cfg)
	if err != nil {
		return NodesResult{}, err
	}
	s.reqs = reqs
	for r := range s.t.requests() {
		if err := ctx.Err(); err != nil {
			return s.res, fmt.Errorf("nodes: stopped before request %d: %w", r, err)
		}
		if err := s.step(r); err != nil {
			return s.res, fmt.Errorf("nodes: request %d: %w", r, err)
		}
		if progress != nil {
			progress(r+1, s.t.requests())
		}
	}
	return s.finish(), nil
}

// simTier is one bounded tier of block numbers under a policy. It tells
// the router's index what it admits and evicts through onAdd and onDrop.
type simTier struct {
	capacity int
	cached   []bool
	pinned   []int32 // stamp of the request that last pinned each block
	stamp    int32
	used     int
	p        policy.Policy[uint64]
	busy     func(uint64) bool
	onAdd    func(b int32) error
	onDrop   func(b int32) error
}

func newSimTier(blocks, capacity int, policyName string) *simTier {
	p, _ := policy.New[uint64](policyName) // checked by NodesConfig.check
	c := &simTier{capacity: capacity, cached: make([]bool, blocks), pinned: make([]int32, blocks), p: p}
	c.busy = func(k uint64) bool { return c.pinned[k] == c.stamp }
	return c
}

func (c *simTier) has(b int32) bool { return c != nil && c.cached[b] }

func (c *simTier) pin(b, stamp int32) {
	if c != nil {
		c.pinned[b], c.stamp = stamp, stamp
	}
}

// put admits b, evicting unpinned blocks to make room; it gives up when
// everything cached is pinned, as a full engine would drop the write.
func (c *simTier) put(b int32) error {
	if c == nil || c.cached[b] {
		return nil
	}
	for c.used >= c.capacity {
		v, ok := c.p.Evict(c.busy)
		if !ok {
			return nil
		}
		c.cached[v], c.used = false, c.used-1
		if c.onDrop != nil {
			if err := c.onDrop(int32(v)); err != nil {
				return err
			}
		}
	}
	c.cached[b], c.used = true, c.used+1
	c.p.Admit(uint64(b))
	if c.onAdd != nil {
		return c.onAdd(b)
	}
	return nil
}

// simNode is one kvtier daemon: a RAM tier and an optional disk tier.
type simNode struct {
	ram, disk *simTier
}

// tier returns the node's tier a source names, nil if it has none.
func (n *simNode) tier(src int) *simTier {
	if src == SourceRAM {
		return n.ram
	}
	return n.disk
}

type nodesSim struct {
	t        *trace
	cfg      NodesConfig
	nodes    []simNode
	remote   *simTier
	ix       *index.Index
	ids      []index.PodID
	scorer   index.Scorer
	next     int // round-robin cursor for ties
	reqs     []Request
	inflight [][]float64 // each node's requests in flight, by finish time
	res      NodesResult

	hashes []uint64
	scores []index.PodScore
	one    [1]uint64
	served []int // source of each block of the current request
	peer   []int // peer that served each peer block
}

func newNodesSim(t *trace, cfg NodesConfig) (*nodesSim, error) {
	ix, err := index.New(index.Config{MaxBlocks: max(t.blocks, 1)})
	if err != nil {
		return nil, err
	}
	scorer, _ := index.NewScorer(cfg.Scorer) // checked by NodesConfig.check
	s := &nodesSim{t: t, cfg: cfg, ix: ix, scorer: scorer,
		inflight: make([][]float64, cfg.Nodes),
		res:      NodesResult{Routing: cfg.Routing, P2P: cfg.P2P, NodeRequests: make([]int, cfg.Nodes)}}
	for i := range cfg.Nodes {
		id := index.PodID(i)
		s.ids = append(s.ids, id)
		n := simNode{ram: s.indexed(newSimTier(t.blocks, cfg.RAMBlocks, cfg.Policy), id, index.CPU)}
		if cfg.DiskBlocks > 0 {
			n.disk = s.indexed(newSimTier(t.blocks, cfg.DiskBlocks, cfg.Policy), id, index.Disk)
		}
		s.nodes = append(s.nodes, n)
	}
	if cfg.RemoteBlocks > 0 {
		// The controller does not route by the remote store: every node
		// reaches it equally, so it stays out of the index.
		s.remote = newSimTier(t.blocks, cfg.RemoteBlocks, cfg.Policy)
	}
	return s, nil
}

// indexed makes tier c report its holdings to the router's index as pod
// id's blocks in tier.
func (s *nodesSim) indexed(c *simTier, id index.PodID, tier index.Tier) *simTier {
	c.onAdd = func(b int32) error {
		s.one[0] = blockHash(b)
		return s.ix.Add(id, tier, s.one[:])
	}
	c.onDrop = func(b int32) error {
		s.one[0] = blockHash(b)
		return s.ix.Remove(id, tier, s.one[:])
	}
	return c
}

// blockHash is the index key of block b; it stays clear of zero.
func blockHash(b int32) uint64 { return uint64(b) + 1 }

func (s *nodesSim) step(r int) error {
	t := s.t
	refs := t.refs[t.starts[r]:t.starts[r+1]]
	now := float64(s.reqs[r].Timestamp) / 1000
	s.retire(now)
	n := s.route(refs)
	s.res.Requests++
	s.res.NodeRequests[n]++
	missed := s.res.ByTier[SourceMiss]
	s.lookup(n, refs, t.last[r])
	// The node is busy for the prefill it recomputes and the decode.
	missed = s.res.ByTier[SourceMiss] - missed
	s.inflight[n] = append(s.inflight[n], now+float64(missed)/s.cfg.PrefillRate+float64(s.reqs[r].OutputLength)/s.cfg.DecodeRate)
	return s.storeAll(&s.nodes[n], refs, int32(r+1))
}

// retire ends the requests finished by now.
func (s *nodesSim) retire(now float64) {
	for i := range s.inflight {
		s.inflight[i] = slices.DeleteFunc(s.inflight[i], func(f float64) bool { return f <= now })
	}
}

// storeAll pins the request's blocks in every tier it writes, so making
// room for one of them never evicts another, then writes them through.
func (s *nodesSim) storeAll(node *simNode, refs []int32, stamp int32) error {
	for _, b := range refs {
		node.ram.pin(b, stamp)
		node.disk.pin(b, stamp)
		s.remote.pin(b, stamp)
	}
	for i, b := range refs {
		if err := s.store(node, b, s.served[i]); err != nil {
			return err
		}
	}
	return nil
}

// route returns the node the controller's scorer prefers for the prompt,
// or the next in turn under round robin.
func (s *nodesSim) route(refs []int32) int {
	if s.cfg.Routing == RouteRoundRobin {
		i := s.next
		s.next = (s.next + 1) % len(s.nodes)
		return i
	}
	s.hashes = s.hashes[:0]
	for _, b := range refs {
		s.hashes = append(s.hashes, blockHash(b))
	}
	s.scores = s.scorer.Score(s.ix, s.hashes, s.ids, s.scores[:0])
	best, bestScore := -1, 0.0
	for k := range s.nodes {
		i := (s.next + k) % len(s.nodes)
		sc := s.scoreOf(s.ids[i])
		if s.cfg.Routing == RouteKVTierLoad {
			sc = s.share(sc, len(refs)) - s.cfg.LoadWeight*float64(len(s.inflight[i]))
		}
		if best < 0 || sc > bestScore {
			best, bestScore = i, sc
		}
	}
	s.next = (s.next + 1) % len(s.nodes)
	return best
}

// share turns a score into a share of the prompt, the unit LoadWeight
// prices load in: coverage already is one, the others count blocks.
func (s *nodesSim) share(score float64, blocks int) float64 {
	if s.cfg.Scorer == index.ScorerCoverage || blocks == 0 {
		return score
	}
	return score / float64(blocks)
}

func (s *nodesSim) scoreOf(id index.PodID) float64 {
	for _, sc := range s.scores {
		if sc.Pod == id {
			return sc.Score
		}
	}
	return 0
}

// lookup finds each block of the prompt down node n's waterfall, counting
// its tokens by source and touching the tier that served it. The first
// block found nowhere ends the cached prefix.
func (s *nodesSim) lookup(n int, refs []int32, last int32) {
	s.served, s.peer = s.served[:0], s.peer[:0]
	missed := false
	for i, b := range refs {
		src, peer := SourceMiss, -1
		if !missed {
			src, peer = s.find(n, b)
			missed = src == SourceMiss
		}
		s.served = append(s.served, src)
		s.peer = append(s.peer, peer)
		tokens := int64(BlockSize)
		if i == len(refs)-1 {
			tokens = int64(last)
		}
		s.res.Tokens += tokens
		s.res.ByTier[src] += tokens
		if src == SourcePeer {
			if s.nodes[peer].ram.has(b) {
				s.res.PeerRAM += tokens
			} else {
				s.res.PeerDisk += tokens
			}
		}
		s.touch(n, b, src, peer)
	}
}

// find returns where node n's waterfall finds block b and, for a peer
// hit, which peer: the first peer after n holding it in RAM, else the
// first holding it on disk, so no one peer serves the whole cluster.
func (s *nodesSim) find(n int, b int32) (int, int) {
	node := &s.nodes[n]
	switch {
	case node.ram.has(b):
		return SourceRAM, -1
	case node.disk.has(b):
		return SourceDisk, -1
	}
	if s.cfg.P2P {
		for _, src := range []int{SourceRAM, SourceDisk} {
			for k := 1; k < len(s.nodes); k++ {
				p := (n + k) % len(s.nodes)
				if s.nodes[p].tier(src).has(b) {
					return SourcePeer, p
				}
			}
		}
	}
	if s.remote.has(b) {
		return SourceRemote, -1
	}
	return SourceMiss, -1
}

// touch records the read of block b on the tier that served it.
func (s *nodesSim) touch(n int, b int32, src, peer int) {
	var c *simTier
	switch src {
	case SourceRAM, SourceDisk:
		c = s.nodes[n].tier(src)
	case SourcePeer:
		c = s.nodes[peer].ram
		if !c.has(b) {
			c = s.nodes[peer].disk
		}
	case SourceRemote:
		c = s.remote
	}
	if c != nil {
		c.p.Access(uint64(b))
	}
}

// store writes block b through node's tiers and the remote store after
// the lookup served it from src. A recomputed block that a tier still
// holds (past a hole in the prefix) counts as an access there, as an
// engine's store of a cached chunk would.
func (s *nodesSim) store(node *simNode, b int32, src int) error {
	for _, c := range []*simTier{node.ram, node.disk, s.remote} {
		if c == nil {
			continue
		}
		if c.has(b) {
			if src == SourceMiss {
				c.p.Access(uint64(b))
			}
			continue
		}
		if err := c.put(b); err != nil {
			return err
		}
	}
	return nil
}

func (s *nodesSim) finish() NodesResult {
	r := s.res
	if r.Tokens > 0 {
		for i, v := range r.ByTier {
			r.Fractions[i] = float64(v) / float64(r.Tokens)
		}
	}
	return r
}
