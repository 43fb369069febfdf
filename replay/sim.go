package replay

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"

	"kvtier/tier/policy"
)

// Names of the reference simulations, usable wherever a policy name is.
const (
	OPT      = "OPT"      // Belady's offline optimum
	Infinite = "INFINITE" // a cache that never evicts
)

// Result is the outcome of one simulation or replay.
type Result struct {
	Policy         string
	CapacityBlocks int // 0 for a replay through a real cache
	Requests       int
	BlockRefs      int   // blocks referenced, partial blocks included
	HitBlocks      int   // references that were prefix hits
	Tokens         int64 // prompt tokens
	HitTokens      int64 // prompt tokens served from the cache
}

// HitRate returns hit blocks over block references, in [0, 1].
func (r Result) HitRate() float64 {
	if r.BlockRefs == 0 {
		return 0
	}
	return float64(r.HitBlocks) / float64(r.BlockRefs)
}

// trace is a request list compiled for simulation: hash ids renamed to
// dense block numbers so per-block state lives in plain slices.
type trace struct {
	refs   []int32 // block of every reference, request after request
	starts []int32 // request r references refs[starts[r]:starts[r+1]]
	depth  []int32 // position of each reference within its request
	last   []int32 // tokens in each request's last block
	blocks int     // distinct blocks
	tokens int64
}

func compile(reqs []Request) *trace {
	t := &trace{starts: make([]int32, 0, len(reqs)+1), last: make([]int32, len(reqs))}
	ids := make(map[uint64]int32)
	for r := range reqs {
		t.starts = append(t.starts, int32(len(t.refs)))
		t.tokens += int64(reqs[r].InputLength)
		for i, id := range reqs[r].HashIDs {
			b, ok := ids[id]
			if !ok {
				b = int32(len(ids))
				ids[id] = b
			}
			t.refs = append(t.refs, b)
			t.depth = append(t.depth, int32(i))
		}
		if n := len(reqs[r].HashIDs); n > 0 {
			t.last[r] = int32(reqs[r].BlockLen(n - 1))
		}
	}
	t.starts = append(t.starts, int32(len(t.refs)))
	t.blocks = len(ids)
	return t
}

func (t *trace) requests() int { return len(t.starts) - 1 }

// evictor is the replacement logic a simulation runs: a policy or OPT.
// pos is the index of the reference in trace.refs.
type evictor interface {
	access(b int32, pos int)
	admit(b int32, pos int)
	evict(busy func(int32) bool) (int32, bool)
}

// simulation is one cache of capacity blocks replaying a trace.
type simulation struct {
	t        *trace
	e        evictor
	capacity int
	cached   []bool
	pinned   []int32 // request number + 1 of the request that last pinned each block
	current  int32
	used     int
}

// simulate replays the trace through a cache of capacity blocks whose
// victims e chooses, with the hit semantics of the package doc.
func (t *trace) simulate(name string, e evictor, capacity int) Result {
	return t.simulateHits(name, e, capacity, nil)
}

// simulateHits is simulate, calling hit (when not nil) with the position
// of every reference that hits.
func (t *trace) simulateHits(name string, e evictor, capacity int, hit func(pos int)) Result {
	s := &simulation{
		t: t, e: e, capacity: max(capacity, 0),
		cached: make([]bool, t.blocks), pinned: make([]int32, t.blocks),
	}
	busy := func(b int32) bool { return s.pinned[b] == s.current }
	res := Result{Policy: name, CapacityBlocks: capacity, Requests: t.requests(), BlockRefs: len(t.refs), Tokens: t.tokens}
	for r := range t.requests() {
		lo, hi := int(t.starts[r]), int(t.starts[r+1])
		refs := t.refs[lo:hi]
		hits := 0
		for hits < len(refs) && s.cached[refs[hits]] {
			hits++
		}
		res.HitBlocks += hits
		for i := 0; hit != nil && i < hits; i++ {
			hit(lo + i)
		}
		res.HitTokens += int64(hits) * BlockSize
		if hits == len(refs) && hits > 0 {
			res.HitTokens -= int64(BlockSize - t.last[r])
		}
		s.current = int32(r + 1)
		for _, b := range refs {
			s.pinned[b] = s.current
		}
		for i, b := range refs {
			s.store(b, lo+i, busy)
		}
	}
	return res
}

// store accesses block b if it is cached and otherwise makes room for it
// and admits it, unless everything cached is pinned.
func (s *simulation) store(b int32, pos int, busy func(int32) bool) {
	if s.cached[b] {
		s.e.access(b, pos)
		return
	}
	for s.used >= s.capacity {
		v, ok := s.e.evict(busy)
		if !ok {
			return
		}
		s.cached[v] = false
		s.used--
	}
	s.cached[b] = true
	s.used++
	s.e.admit(b, pos)
}

// policyEvictor adapts a policy with uint64 keys. A prefix-aware policy
// learns each block's parent: the block before it in the request.
type policyEvictor struct {
	t       *trace
	p       policy.Policy[uint64]
	busy    func(int32) bool
	keyBusy func(uint64) bool
}

func newPolicyEvictor(t *trace, p policy.Policy[uint64]) *policyEvictor {
	e := &policyEvictor{t: t, p: p}
	e.keyBusy = func(k uint64) bool { return e.busy(int32(k)) }
	return e
}

func (e *policyEvictor) access(b int32, _ int) { e.p.Access(uint64(b)) }
func (e *policyEvictor) admit(b int32, pos int) {
	hasParent := e.t.depth[pos] > 0
	var parent uint64
	if hasParent {
		parent = uint64(e.t.refs[pos-1])
	}
	policy.AdmitAfter(e.p, uint64(b), parent, hasParent)
}
func (e *policyEvictor) evict(busy func(int32) bool) (int32, bool) {
	e.busy = busy
	k, ok := e.p.Evict(e.keyBusy)
	return int32(k), ok
}

// never is the evictor of an unbounded cache.
type never struct{}

func (never) access(int32, int)                    {}
func (never) admit(int32, int)                     {}
func (never) evict(func(int32) bool) (int32, bool) { return 0, false }

// run simulates one named policy, OPT or Infinite on a compiled trace.
func (t *trace) run(name string, capacity int) (Result, error) {
	switch strings.ToUpper(name) {
	case OPT:
		return t.simulate(OPT, newBelady(t), capacity), nil
	case Infinite:
		r := t.simulate(Infinite, never{}, math.MaxInt)
		r.CapacityBlocks = 0 // unbounded
		return r, nil
	}
	p, err := policy.New[uint64](name)
	if err != nil {
		return Result{}, fmt.Errorf("replay: %w", err)
	}
	return t.simulate(p.Name(), newPolicyEvictor(t, p), capacity), nil
}

// Simulate replays reqs through a cache of capacityBlocks blocks under the
// named eviction policy (any name policy.New accepts, or OPT).
func Simulate(reqs []Request, policyName string, capacityBlocks int) (Result, error) {
	return compile(reqs).run(policyName, capacityBlocks)
}

// SimulateOPT replays reqs under Belady's offline optimum.
func SimulateOPT(reqs []Request, capacityBlocks int) Result {
	r, _ := compile(reqs).run(OPT, capacityBlocks)
	return r
}

// SimulateInfinite replays reqs through a cache that never evicts: the
// upper bound of any hit rate on the trace.
func SimulateInfinite(reqs []Request) Result {
	r, _ := compile(reqs).run(Infinite, 0)
	return r
}

// Summary describes a trace.
type Summary struct {
	Requests       int
	BlockRefs      int
	DistinctBlocks int
	Tokens         int64
}

// Summarize counts a trace's requests, block references, distinct blocks
// and prompt tokens.
func Summarize(reqs []Request) Summary {
	t := compile(reqs)
	return Summary{Requests: t.requests(), BlockRefs: len(t.refs), DistinctBlocks: t.blocks, Tokens: t.tokens}
}

// Sweep simulates every policy (names as for Simulate, OPT included) at
// every capacity, in parallel on all CPUs, and returns the results
// policy-major in the order given.
func Sweep(reqs []Request, policies []string, capacities []int) ([]Result, error) {
	for _, name := range policies {
		if n := strings.ToUpper(name); n != OPT && n != Infinite {
			if _, err := policy.New[uint64](name); err != nil {
				return nil, fmt.Errorf("replay: %w", err)
			}
		}
	}
	t := compile(reqs)
	results := make([]Result, len(policies)*len(capacities))
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(results)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				results[j], _ = t.run(policies[j/len(capacities)], capacities[j%len(capacities)])
			}
		}()
	}
	for j := range results {
		jobs <- j
	}
	close(jobs)
	wg.Wait()
	return results, nil
}
