package replay

import (
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"kvtier/tier/policy"
)

// requests builds full-block requests from hash id lists.
func requests(chains ...[]uint64) []Request {
	reqs := make([]Request, len(chains))
	for i, c := range chains {
		reqs[i] = Request{Timestamp: int64(i), InputLength: len(c) * BlockSize, HashIDs: c}
	}
	return reqs
}

// tiny is worked by hand in TestTinyTrace.
var tiny = requests([]uint64{1, 2}, []uint64{1, 3}, []uint64{1, 2}, []uint64{4}, []uint64{1, 3})

// TestTinyTrace checks exact hits on a trace small enough to follow by
// hand (cache contents oldest first; a request's blocks are pinned):
//
//	capacity 3, LRU:  [1 2] miss miss → 1 2;  [1 3] hit miss → 2 1 3;
//	                  [1 2] hit hit → 3 1 2;  [4] miss, evict 3 → 1 2 4;
//	                  [1 3] hit miss, evict 2 → 4 1 3.           4 hits
//	capacity 3, FIFO: as LRU until [4] evicts 1 (oldest insert) → 2 3 4;
//	                  [1 3] miss (1 is gone, so 3 is no prefix hit).  3 hits
//	capacity 3, OPT:  [4] evicts 2, never used again; [1 3] hit hit.  5 hits
//	capacity 2, LRU:  [1 2]; [1 3] hit, evict 2; [1 2] hit, evict 3;
//	                  [4] evict 1; [1 3] miss miss.              2 hits
//	capacity 2, OPT:  [1 3] hit, evict 2 (the only idle block); [1 2] hit,
//	                  evict 3; [4] evicts 2 (never again, 1 is needed);
//	                  [1 3] hit, evict 4.                        3 hits
func TestTinyTrace(t *testing.T) {
	for _, tc := range []struct {
		policy   string
		capacity int
		hits     int
	}{
		{policy.LRU, 3, 4}, {policy.FIFO, 3, 3}, {OPT, 3, 5},
		{policy.LRU, 2, 2}, {OPT, 2, 3},
		{policy.LRU, 0, 0}, {OPT, 0, 0},
	} {
		r, err := Simulate(tiny, tc.policy, tc.capacity)
		if err != nil {
			t.Fatal(err)
		}
		if r.HitBlocks != tc.hits || r.BlockRefs != 9 || r.Requests != 5 {
			t.Errorf("%s capacity %d: %d hits of %d references in %d requests, want %d of 9 in 5",
				tc.policy, tc.capacity, r.HitBlocks, r.BlockRefs, r.Requests, tc.hits)
		}
		if r.HitTokens != int64(tc.hits*BlockSize) || r.Tokens != 9*BlockSize {
			t.Errorf("%s capacity %d: %d of %d tokens hit, want %d of %d", tc.policy, tc.capacity, r.HitTokens, r.Tokens, tc.hits*BlockSize, 9*BlockSize)
		}
	}
	if r := SimulateOPT(tiny, 3); r.HitBlocks != 5 || r.Policy != OPT {
		t.Errorf("SimulateOPT = %+v, want 5 hits", r)
	}
	if r := SimulateInfinite(tiny); r.HitBlocks != 5 || r.HitRate() != 5.0/9 {
		t.Errorf("SimulateInfinite = %+v, want 5 hits of 9", r)
	}
}

func TestPartialBlockTokens(t *testing.T) {
	reqs := []Request{
		{InputLength: 812, HashIDs: []uint64{1, 2}},
		{InputLength: 812, HashIDs: []uint64{1, 2}}, // all hit, the last block holds 300 tokens
		{InputLength: 700, HashIDs: []uint64{1, 3}}, // first block hits
	}
	r, err := Simulate(reqs, policy.LRU, 10)
	if err != nil {
		t.Fatal(err)
	}
	if r.HitBlocks != 3 || r.HitTokens != 812+512 || r.Tokens != 812+812+700 {
		t.Errorf("%d blocks, %d of %d tokens hit; want 3 blocks, %d of %d tokens", r.HitBlocks, r.HitTokens, r.Tokens, 812+512, 812+812+700)
	}
}

func TestRequestLongerThanCache(t *testing.T) {
	reqs := requests([]uint64{1, 2, 3, 4}, []uint64{1, 2, 3, 4})
	for _, name := range append(policy.Names(), OPT) {
		r, err := Simulate(reqs, name, 2)
		if err != nil {
			t.Fatal(err)
		}
		// The first two blocks fit, the rest find only pinned blocks.
		if r.HitBlocks != 2 {
			t.Errorf("%s: %d hits, want 2", name, r.HitBlocks)
		}
	}
}

func TestSimulateUnknownPolicy(t *testing.T) {
	if _, err := Simulate(tiny, "clock", 3); err == nil || !strings.Contains(err.Error(), "LRU") {
		t.Errorf("error %v, want one listing the valid policies", err)
	}
	if _, err := Sweep(tiny, []string{"LRU", "clock"}, []int{3}); err == nil {
		t.Error("Sweep accepted an unknown policy")
	}
}

func TestSweepMatchesSimulate(t *testing.T) {
	reqs := randomTrace(rand.New(rand.NewPCG(5, 6)), 200, 60)
	policies := []string{"lru", "S3-FIFO", "arc", "opt"}
	capacities := []int{1, 5, 20, 80}
	got, err := Sweep(reqs, policies, capacities)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(policies)*len(capacities) {
		t.Fatalf("%d results, want %d", len(got), len(policies)*len(capacities))
	}
	for i, r := range got {
		want, err := Simulate(reqs, policies[i/len(capacities)], capacities[i%len(capacities)])
		if err != nil {
			t.Fatal(err)
		}
		if r != want {
			t.Errorf("result %d = %+v, Simulate says %+v", i, r, want)
		}
	}
}

// randomTrace draws requests from a random forest of blocks: each request
// is the chain from a root down to a random block, so ids are prefix
// chained like a real trace. A skewed choice of blocks makes reuse likely.
// Half the requests end in a partial block whose id, like a real trace's,
// stands for its parent chain and its length.
func randomTrace(r *rand.Rand, n, blocks int) []Request {
	parent := make([]int, blocks)
	for b := range parent {
		parent[b] = -1
		if b > 0 && r.IntN(4) > 0 {
			parent[b] = r.IntN(b)
		}
	}
	reqs := make([]Request, n)
	for i := range reqs {
		b := int(float64(blocks) * r.Float64() * r.Float64())
		var chain []uint64
		for ; b >= 0; b = parent[b] {
			chain = append(chain, uint64(b)+100)
		}
		slices.Reverse(chain)
		length := len(chain) * BlockSize
		if r.IntN(2) == 0 {
			tail := 100 + 200*r.IntN(2)
			chain = append(chain, 1<<20+chain[len(chain)-1]*BlockSize+uint64(tail))
			length += tail
		}
		reqs[i] = Request{Timestamp: int64(i), InputLength: length, HashIDs: chain}
	}
	return reqs
}

func TestOPTBoundsEveryPolicy(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := range 60 {
		reqs := randomTrace(rng, 20+rng.IntN(150), 5+rng.IntN(60))
		inf := SimulateInfinite(reqs)
		for _, capacity := range []int{1, 2, 3, 5, 8, 13, 30} {
			opt := SimulateOPT(reqs, capacity)
			if opt.HitBlocks > inf.HitBlocks {
				t.Fatalf("trial %d capacity %d: OPT %d hits above the infinite cache's %d", trial, capacity, opt.HitBlocks, inf.HitBlocks)
			}
			for _, name := range policy.Names() {
				r, _ := Simulate(reqs, name, capacity)
				if r.HitBlocks > opt.HitBlocks {
					t.Fatalf("trial %d capacity %d: %s hits %d blocks, OPT only %d", trial, capacity, name, r.HitBlocks, opt.HitBlocks)
				}
			}
		}
	}
}

// TestOPTIsOptimal compares SimulateOPT with an exhaustive search over
// every possible victim at every eviction, on traces small enough for it.
func TestOPTIsOptimal(t *testing.T) {
	if got := bestPossible(compile(tiny), 2); got != 3 {
		t.Fatalf("exhaustive search on the tiny trace: %d hits, worked by hand: 3", got)
	}
	rng := rand.New(rand.NewPCG(9, 10))
	lruBeaten := 0
	for trial := range 300 {
		reqs := randomTrace(rng, 3+rng.IntN(8), 3+rng.IntN(10))
		for capacity := 1; capacity <= 4; capacity++ {
			want := bestPossible(compile(reqs), capacity)
			if got := SimulateOPT(reqs, capacity).HitBlocks; got != want {
				t.Fatalf("trial %d capacity %d: OPT hits %d, best possible %d\ntrace %+v", trial, capacity, got, want, reqs)
			}
			if lru, _ := Simulate(reqs, policy.LRU, capacity); lru.HitBlocks < want {
				lruBeaten++
			}
		}
	}
	t.Logf("LRU below the optimum in %d of 1200 cases", lruBeaten)
	if lruBeaten < 50 {
		t.Errorf("only %d of 1200 cases separate LRU from the optimum: the traces are too easy to test OPT", lruBeaten)
	}
}

// bestPossible finds the most prefix hits any eviction choices achieve
// under the simulator's rules. Blocks are bits of a uint64.
func bestPossible(t *trace, capacity int) int {
	best := 0
	var search func(r, i int, cached uint64, hits int)
	search = func(r, i int, cached uint64, hits int) {
		if r == t.requests() {
			best = max(best, hits)
			return
		}
		refs := t.refs[t.starts[r]:t.starts[r+1]]
		if i == 0 {
			for _, b := range refs {
				if cached&(1<<b) == 0 {
					break
				}
				hits++
			}
		}
		if i == len(refs) {
			search(r+1, 0, cached, hits)
			return
		}
		b := uint64(1) << refs[i]
		if cached&b != 0 || bits.OnesCount64(cached) < capacity {
			search(r, i+1, cached|b, hits)
			return
		}
		var pinned uint64
		for _, p := range refs {
			pinned |= 1 << p
		}
		idle := cached &^ pinned
		if idle == 0 {
			search(r, i+1, cached, hits)
			return
		}
		for v := idle; v != 0; v &= v - 1 {
			search(r, i+1, cached&^(v&-v)|b, hits)
		}
	}
	search(0, 0, 0, 0)
	return best
}

func BenchmarkSimulate(b *testing.B) {
	reqs := randomTrace(rand.New(rand.NewPCG(1, 1)), 5000, 20000)
	t := compile(reqs)
	for _, name := range []string{policy.LRU, policy.S3FIFO, OPT} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				t.run(name, 2000)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(t.refs)), "ns/ref")
		})
	}
}
