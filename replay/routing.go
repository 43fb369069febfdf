package replay

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"slices"

	"kvtier/chunk"
	"kvtier/kvevents"
	"kvtier/router/index"
	"kvtier/router/ingest"
)

// Routing policies SimulateRouting compares.
const (
	RouteKVTier      = "kvtier"       // longest cached prefix by the router's index; ties to the least loaded
	RouteKVTierLoad  = "kvtier+load"  // prefix share minus LoadWeight × requests in flight
	RouteRoundRobin  = "round-robin"  // pods in turn
	RouteLeastLoaded = "least-loaded" // fewest requests in flight
	routeModel       = "trace-model"  // the model name in event topics
	routeSeed        = "0"            // PYTHONHASHSEED of the simulated pods
	routeBlockTokens = 16             // vLLM's default block size
)

// RoutePolicies lists the policies in report order.
var RoutePolicies = []string{RouteKVTier, RouteKVTierLoad, RouteRoundRobin, RouteLeastLoaded}

// RouteConfig describes the simulated fleet.
type RouteConfig struct {
	Pods      int // serving pods
	GPUBlocks int // each pod's prefix cache, in 16-token blocks
	// Service-time model for load: a request stays in flight for its
	// uncached prompt tokens at PrefillRate plus its output tokens at
	// DecodeRate (tokens per second each).
	PrefillRate, DecodeRate float64
	// LoadWeight is kvtier+load's price of one request in flight, in
	// shares of the prompt found cached (default 0.05).
	LoadWeight float64
}

func (c *RouteConfig) check() error {
	switch {
	case c.Pods < 1 || c.Pods > 1024:
		return fmt.Errorf("route: %d pods, want 1 to 1024", c.Pods)
	case c.GPUBlocks < 1:
		return fmt.Errorf("route: %d GPU blocks per pod, want at least 1", c.GPUBlocks)
	case c.PrefillRate <= 0 || c.DecodeRate <= 0:
		return errors.New("route: prefill and decode rates must be positive")
	}
	if c.LoadWeight == 0 {
		c.LoadWeight = 0.05
	}
	return nil
}

// RouteResult is one policy's outcome over a trace.
type RouteResult struct {
	Policy    string  `json:"policy"`
	Requests  int     `json:"requests"`
	Tokens    int64   `json:"prompt_tokens"`
	HitTokens int64   `json:"hit_tokens"` // served from the chosen pod's prefix cache
	HitRate   float64 `json:"hit_rate"`
	// Load balance: requests and prefill tokens computed per pod, and the
	// busiest pod's share over the mean (1 is perfect balance).
	PodRequests      []int   `json:"pod_requests"`
	PodComputed      []int64 `json:"pod_computed_tokens"`
	RequestImbalance float64 `json:"request_imbalance"`
	ComputeImbalance float64 `json:"compute_imbalance"`
	// MeanInFlight is the mean number of requests already in flight on
	// the chosen pod when a request arrives (a queueing proxy).
	MeanInFlight float64 `json:"mean_in_flight"`
	// RouterAgreement is the share of requests whose router-predicted hit
	// (from the index fed by events) equals the pod's true hit.
	RouterAgreement float64                    `json:"router_agreement"`
	Events          map[string]ingest.PodStats `json:"-"`
}

// SimulateRouting replays reqs across simulated vLLM pods and routes each
// request by policy. Every pod keeps an LRU prefix cache of 16-token
// blocks keyed by vLLM's sha256_cbor block hashes of the prompt's tokens
// (BlockTokens mapping) and, like vLLM, publishes a KV-event batch after
// each request: BlockStored for the blocks it added, BlockRemoved for
// those it evicted, encoded as vLLM's tagged arrays (package kvevents). The router's
// index is fed only through those messages (ingest.Feeder), so the kvtier
// policies see exactly what a real router would.
func SimulateRouting(ctx context.Context, reqs []Request, cfg RouteConfig, policy string, progress func(done, total int)) (RouteResult, error) {
	if err := cfg.check(); err != nil {
		return RouteResult{}, err
	}
	if !slices.Contains(RoutePolicies, policy) {
		return RouteResult{}, fmt.Errorf("route: unknown policy %q (want one of %v)", policy, RoutePolicies)
	}
	s, err := newRouteSim(cfg, policy)
	if err != nil {
		return RouteResult{}, err
	}
	for r := range reqs {
		if err := ctx.Err(); err != nil {
			return s.res, fmt.Errorf("route: stopped before request %d: %w", r, err)
		}
		if err := reqs[r].validate(); err != nil {
			return s.res, fmt.Errorf("route: request %d: %w", r, err)
		}
		if err := s.step(&reqs[r]); err != nil {
			return s.res, fmt.Errorf("route: request %d: %w", r, err)
		}
		if progress != nil {
			progress(r+1, len(reqs))
		}
	}
	return s.finish(), nil
}

// routeSim is the state of one policy's run.
type routeSim struct {
	cfg    RouteConfig
	policy string
	hasher *chunk.VLLMHasher
	ix     *index.Index
	pods   *index.Pods
	feeder *ingest.Feeder
	fleet  []*simPod
	ids    []index.PodID
	next   int // round-robin cursor
	res    RouteResult

	inflightSum int64
	agree       int
	tokens      []uint32
	digests     [][32]byte
	hashes      []uint64
	scores      []index.PodScore
}

func newRouteSim(cfg RouteConfig, policy string) (*routeSim, error) {
	hasher, err := chunk.NewVLLMHasher(routeSeed, routeBlockTokens)
	if err != nil {
		return nil, err
	}
	ix, err := index.New(index.Config{MaxBlocks: 4 * cfg.Pods * cfg.GPUBlocks})
	if err != nil {
		return nil, err
	}
	pods := index.NewPods()
	s := &routeSim{cfg: cfg, policy: policy, hasher: hasher, ix: ix, pods: pods,
		feeder: ingest.NewFeeder(ix, pods, ""),
		res:    RouteResult{Policy: policy, PodRequests: make([]int, cfg.Pods), PodComputed: make([]int64, cfg.Pods)}}
	for i := range cfg.Pods {
		name := fmt.Sprintf("pod-%d", i)
		id, err := pods.Intern(name)
		if err != nil {
			return nil, err
		}
		s.ids = append(s.ids, id)
		s.fleet = append(s.fleet, newSimPod(name, cfg.GPUBlocks))
	}
	return s, nil
}

func (s *routeSim) step(req *Request) error {
	s.tokens = promptTokens(req, s.tokens[:0])
	s.digests = s.hasher.BlockHashes(s.digests[:0], s.tokens, chunk.VLLMRequest{})
	s.hashes = s.hashes[:0]
	for i := range s.digests {
		s.hashes = append(s.hashes, chunk.EventHash(s.digests[i]))
	}
	now := float64(req.Timestamp) / 1000
	for _, p := range s.fleet {
		p.retire(now)
	}
	choice, predicted := s.choose()
	p := s.fleet[choice]
	hitBlocks := p.prefix(s.hashes)
	if hitBlocks == predicted {
		s.agree++
	}
	hit := hitBlocks * routeBlockTokens
	computed := len(s.tokens) - hit
	s.res.Requests++
	s.res.Tokens += int64(len(s.tokens))
	s.res.HitTokens += int64(hit)
	s.res.PodRequests[choice]++
	s.res.PodComputed[choice] += int64(computed)
	s.inflightSum += int64(len(p.finish))
	p.admit(now + float64(computed)/s.cfg.PrefillRate + float64(req.OutputLength)/s.cfg.DecodeRate)

	payload, err := p.store(s.hashes, s.tokens)
	if err != nil {
		return err
	}
	if payload != nil {
		p.seq++
		s.feeder.Handle(p.topic, p.seq, payload)
	}
	return nil
}

// choose picks a pod and returns the router's predicted hit in blocks on
// it (the index's longest prefix there; -1 for policies that do not look).
func (s *routeSim) choose() (int, int) {
	switch s.policy {
	case RouteRoundRobin:
		i := s.next
		s.next = (s.next + 1) % len(s.fleet)
		return i, s.predicted(i)
	case RouteLeastLoaded:
		i := s.leastLoaded()
		return i, s.predicted(i)
	}
	s.scores = index.LongestPrefix{}.Score(s.ix, s.hashes, s.ids, s.scores[:0])
	best, bestVal := -1, 0.0
	for i, p := range s.fleet {
		blocks := s.scoreOf(s.ids[i])
		val := float64(blocks)
		if s.policy == RouteKVTierLoad {
			val = float64(blocks)/float64(max(len(s.hashes), 1)) - s.cfg.LoadWeight*float64(len(p.finish))
		}
		if best < 0 || val > bestVal || (val == bestVal && len(p.finish) < len(s.fleet[best].finish)) {
			best, bestVal = i, val
		}
	}
	return best, s.scoreOf(s.ids[best])
}

func (s *routeSim) scoreOf(id index.PodID) int {
	for _, sc := range s.scores {
		if sc.Pod == id {
			return int(sc.Score)
		}
	}
	return 0
}

// predicted asks the index for pod i's prefix, for the agreement figure.
func (s *routeSim) predicted(i int) int {
	s.scores = index.LongestPrefix{}.Score(s.ix, s.hashes, s.ids[i:i+1], s.scores[:0])
	return s.scoreOf(s.ids[i])
}

func (s *routeSim) leastLoaded() int {
	best := 0
	for i, p := range s.fleet {
		if len(p.finish) < len(s.fleet[best].finish) {
			best = i
		}
	}
	return best
}

func (s *routeSim) finish() RouteResult {
	r := s.res
	if r.Tokens > 0 {
		r.HitRate = float64(r.HitTokens) / float64(r.Tokens)
	}
	if r.Requests > 0 {
		r.MeanInFlight = float64(s.inflightSum) / float64(r.Requests)
		r.RouterAgreement = float64(s.agree) / float64(r.Requests)
	}
	r.RequestImbalance = imbalance(r.PodRequests)
	r.ComputeImbalance = imbalance(r.PodComputed)
	r.Events = s.feeder.Stats()
	return r
}

func imbalance[T int | int64](v []T) float64 {
	var sum, top T
	for _, x := range v {
		sum += x
		top = max(top, x)
	}
	if sum == 0 {
		return 1
	}
	return float64(top) * float64(len(v)) / float64(sum)
}

// simPod is one simulated vLLM pod: an LRU prefix cache of block hashes
// and the finish times of its requests in flight.
type simPod struct {
	topic    []byte
	capacity int
	lru      *list.List // front = most recently used; values are *simBlock
	byHash   map[uint64]*list.Element
	finish   []float64
	seq      uint64
	stamp    uint64 // the request being stored; its blocks are not evictable

	added, removed []uint64
	addedAt        []int    // prompt block index of each added hash
	eventTokens    []uint32 // token ids of the added blocks
	events         kvevents.Batch
}

type simBlock struct {
	hash  uint64
	stamp uint64
}

func newSimPod(name string, capacity int) *simPod {
	return &simPod{topic: []byte("kv@" + name + "@" + routeModel), capacity: capacity,
		lru: list.New(), byHash: make(map[uint64]*list.Element)}
}

func (p *simPod) retire(now float64) {
	p.finish = slices.DeleteFunc(p.finish, func(t float64) bool { return t <= now })
}

func (p *simPod) admit(until float64) { p.finish = append(p.finish, until) }

// prefix returns how many leading hashes the pod caches.
func (p *simPod) prefix(hashes []uint64) int {
	for i, h := range hashes {
		if _, ok := p.byHash[h]; !ok {
			return i
		}
	}
	return len(hashes)
}

// store caches the prompt's blocks (evicting least recently used blocks
// of other prompts) and returns the KV-event batch vLLM would publish, or
// nil when nothing changed. A prompt longer than the cache keeps only its
// first blocks, as vLLM would fail to allocate the rest. Like vLLM, which
// frees a request's blocks tail first, it leaves each block more recently
// used than its children, so eviction takes a prefix's end before its
// start and the cache stays closed under prefixes.
func (p *simPod) store(hashes []uint64, tokens []uint32) ([]byte, error) {
	p.added, p.removed, p.addedAt = p.added[:0], p.removed[:0], p.addedAt[:0]
	p.stamp++
	hit := p.prefix(hashes)
	p.touch(hashes[:hit])
	end := hit
	for ; end < len(hashes); end++ {
		h := hashes[end]
		if e, ok := p.byHash[h]; ok { // a stale child of an evicted parent
			e.Value.(*simBlock).stamp = p.stamp
			continue
		}
		if p.lru.Len() >= p.capacity && !p.evict() {
			break
		}
		p.byHash[h] = p.lru.PushFront(&simBlock{hash: h, stamp: p.stamp})
		p.added = append(p.added, h)
		p.addedAt = append(p.addedAt, end)
	}
	p.touch(hashes[:end])
	if len(p.added) == 0 && len(p.removed) == 0 {
		return nil, nil
	}
	return p.batch(hashes, tokens)
}

// touch marks the blocks used by the current request, last block first.
func (p *simPod) touch(hashes []uint64) {
	for i := len(hashes) - 1; i >= 0; i-- {
		if e, ok := p.byHash[hashes[i]]; ok {
			e.Value.(*simBlock).stamp = p.stamp
			p.lru.MoveToFront(e)
		}
	}
}

// evict drops the least recently used block the current request does not
// use; false when every cached block is in use.
func (p *simPod) evict() bool {
	for e := p.lru.Back(); e != nil; e = e.Prev() {
		b := e.Value.(*simBlock)
		if b.stamp == p.stamp {
			continue
		}
		p.lru.Remove(e)
		delete(p.byHash, b.hash)
		p.removed = append(p.removed, b.hash)
		return true
	}
	return false
}

// batch encodes vLLM's EventBatch with a BlockRemoved event (if any block
// was evicted) and a BlockStored event for the added blocks, as tagged
// arrays (kvevents.Array), the form most vLLM releases wrote.
func (p *simPod) batch(hashes []uint64, tokens []uint32) ([]byte, error) {
	b := &p.events
	b.Reset()
	b.Timestamp = float64(p.seq)
	if len(p.removed) > 0 {
		b.Add(kvevents.Event{Kind: kvevents.BlockRemoved}, p.removed, nil)
	}
	if len(p.added) > 0 {
		e := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: routeBlockTokens}
		if first := p.addedAt[0]; first > 0 {
			e.Parent, e.HasParent = hashes[first-1], true
		}
		p.eventTokens = p.eventTokens[:0]
		for _, blk := range p.addedAt {
			p.eventTokens = append(p.eventTokens, tokens[blk*routeBlockTokens:(blk+1)*routeBlockTokens]...)
		}
		b.Add(e, p.added, p.eventTokens)
	}
	return kvevents.Encoder{Encoding: kvevents.Array}.Append(nil, b), nil
}
