package redisindex_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/internal/redistest"
	"kvtier/router/index"
	"kvtier/router/redisindex"
)

func newIndex(t testing.TB, srv *redistest.Server, pods *index.Pods, ttl time.Duration) *redisindex.Index {
	t.Helper()
	// No retries, so a test of Redis going away does not wait for backoffs.
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	ix, err := redisindex.New(redisindex.Config{Client: rdb, Prefix: "test:", TTL: ttl}, pods)
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

// holdings renders a store's holders of h as sorted "pod/tiers" strings,
// by pod name, so stores with different pod ids compare.
func holdings(s index.Store, pods *index.Pods, h uint64) []string {
	var out []string
	for _, w := range s.HolderWords(h, nil) {
		id, tiers := index.HolderOf(w)
		name, _ := pods.Name(id)
		out = append(out, fmt.Sprintf("%s/%04b", name, tiers))
	}
	slices.Sort(out)
	return out
}

// entries renders what Lookup visits, block by block, by pod name.
func entries(s index.Store, pods *index.Pods, hashes []uint64) [][]string {
	out := make([][]string, len(hashes))
	s.Lookup(hashes, nil, func(i int, holders []index.Entry) bool {
		for _, e := range holders {
			name, _ := pods.Name(e.Pod)
			out[i] = append(out[i], fmt.Sprintf("%s/%v", name, e.Tier))
		}
		slices.Sort(out[i])
		return true
	})
	return out
}

func byName(pods *index.Pods, scores []index.PodScore) map[string]float64 {
	out := map[string]float64{}
	for _, s := range scores {
		name, _ := pods.Name(s.Pod)
		out[name] = s.Score
	}
	return out
}

func must(t *testing.T, errs ...error) {
	t.Helper()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

var scorers = []index.Scorer{
	index.LongestPrefix{}, index.BlockHits{}, index.Coverage{},
	index.TierWeightedPrefix{Weights: index.DefaultTierWeights()},
}

// TestMatchesTheInMemoryIndex applies one random sequence of adds,
// removes and clears to the in-memory index and to the Redis one, whose
// pod registries intern the names in different orders, and compares every
// block's holders, Lookup and every scorer's scores by pod name.
func TestMatchesTheInMemoryIndex(t *testing.T) {
	srv := redistest.Start(t)
	memPods, redisPods := index.NewPods(), index.NewPods()
	mem, err := index.New(index.Config{MaxBlocks: 1 << 16})
	must(t, err)
	rix := newIndex(t, srv, redisPods, 0)
	names := []string{"pod-a", "pod-b", "pod-c", "pod-d", "pod e\n{odd}"}
	for i := range names {
		memPods.Intern(names[i])
		redisPods.Intern(names[len(names)-1-i])
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const blocks = 48
	prompt := make([]uint64, blocks)
	for i := range prompt {
		prompt[i] = rng.Uint64() // full 64-bit hashes, high bits set
	}
	check := func(step int) {
		t.Helper()
		for _, h := range prompt {
			if a, b := holdings(mem, memPods, h), holdings(rix, redisPods, h); !slices.Equal(a, b) {
				t.Fatalf("step %d, block %x: in memory %v, in Redis %v", step, h, a, b)
			}
		}
		if a, b := entries(mem, memPods, prompt), entries(rix, redisPods, prompt); fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("step %d: Lookup in memory %v, in Redis %v", step, a, b)
		}
		cands := []string{"pod-b", "pod-zz", "pod-a"}
		memCands, redisCands := internAll(memPods, cands), internAll(redisPods, cands)
		for _, sc := range scorers {
			got, err := rix.ScoreWith(sc, prompt, nil, nil)
			must(t, err)
			if want := sc.Score(mem, prompt, nil, nil); fmt.Sprint(byName(memPods, want)) != fmt.Sprint(byName(redisPods, got)) {
				t.Fatalf("step %d, %T: in memory %v, Redis %v", step, sc, byName(memPods, want), byName(redisPods, got))
			}
			got, err = rix.ScoreWith(sc, prompt[:blocks/2], redisCands, got[:0])
			must(t, err)
			want := sc.Score(mem, prompt[:blocks/2], memCands, nil)
			if fmt.Sprint(byName(memPods, want)) != fmt.Sprint(byName(redisPods, got)) || len(got) != len(cands) {
				t.Fatalf("step %d, %T with candidates: in memory %v, Redis %v", step, sc, want, got)
			}
		}
	}
	for step := range 300 {
		name := names[rng.IntN(len(names))]
		mid, _ := memPods.ID(name)
		rid, _ := redisPods.ID(name)
		tier := index.Tier(rng.IntN(int(index.NumTiers)))
		start := rng.IntN(blocks)
		hashes := prompt[start:min(blocks, start+1+rng.IntN(12))]
		switch op := rng.IntN(20); {
		case op < 11:
			must(t, mem.Add(mid, tier, hashes), rix.Add(rid, tier, hashes))
		case op < 18:
			must(t, mem.Remove(mid, tier, hashes), rix.Remove(rid, tier, hashes))
		case op == 18:
			mem.ClearPod(mid)
			rix.ClearPod(rid)
		default:
			must(t, mem.ClearPodTier(mid, tier), rix.ClearPodTier(rid, tier))
		}
		if step%25 == 24 {
			check(step)
		}
	}
	check(300)
	if st := rix.Stats(); st != (redisindex.Stats{}) {
		t.Errorf("stats %+v, want all zero", st)
	}
}

func internAll(pods *index.Pods, names []string) []index.PodID {
	ids := make([]index.PodID, len(names))
	for i, n := range names {
		ids[i], _ = pods.Intern(n)
	}
	return ids
}

// TestClearWalksLargePods: ClearPodTier and ClearPod of a pod with more
// blocks than one clear call handles leave nothing behind, and leave
// other pods alone.
func TestClearWalksLargePods(t *testing.T) {
	srv := redistest.Start(t)
	pods := index.NewPods()
	ix := newIndex(t, srv, pods, 0)
	a, _ := pods.Intern("a")
	b, _ := pods.Intern("b")
	hashes := make([]uint64, 3*redisindex.ClearChunk+7)
	for i := range hashes {
		hashes[i] = uint64(i) << 40
	}
	must(t, ix.Add(a, index.GPU, hashes), ix.Add(a, index.Disk, hashes[:10]), ix.Add(b, index.CPU, hashes[:5]))
	must(t, ix.ClearPodTier(a, index.GPU))
	for _, i := range []int{0, 9, 10, len(hashes) - 1} {
		want := []string{"a/0100"}
		if i >= 10 {
			want = nil
		}
		if i < 5 {
			want = append(want, "b/0010")
		}
		if got := holdings(ix, pods, hashes[i]); !slices.Equal(got, want) {
			t.Errorf("block %d after ClearPodTier: %v, want %v", i, got, want)
		}
	}
	ix.ClearPod(a)
	if got := holdings(ix, pods, hashes[0]); !slices.Equal(got, []string{"b/0010"}) {
		t.Errorf("after ClearPod: %v", got)
	}
	if st := ix.Stats(); st.ClearErrors != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestReplicasShareOneView: two indexes with their own pod registries on
// one Redis see each other's writes, by pod name.
func TestReplicasShareOneView(t *testing.T) {
	srv := redistest.Start(t)
	podsA, podsB := index.NewPods(), index.NewPods()
	a, b := newIndex(t, srv, podsA, 0), newIndex(t, srv, podsB, 0)
	podsB.Intern("other") // so the replicas' ids differ
	x, _ := podsA.Intern("pod-x")
	must(t, a.Add(x, index.CPU, []uint64{7, 8, 9}))
	if got := holdings(b, podsB, 8); !slices.Equal(got, []string{"pod-x/0010"}) {
		t.Fatalf("replica B sees %v", got)
	}
	xB, ok := podsB.ID("pod-x")
	if !ok || xB == x {
		t.Fatalf("replica B interned pod-x as %d (%v); A has %d", xB, ok, x)
	}
	scores, err := b.ScoreWith(index.LongestPrefix{}, []uint64{7, 8, 9, 10}, nil, nil)
	must(t, err)
	if len(scores) != 1 || scores[0] != (index.PodScore{Pod: xB, Score: 3}) {
		t.Errorf("replica B scores %v", scores)
	}
	must(t, b.Add(xB, index.GPU, []uint64{8}))
	if got := holdings(a, podsA, 8); !slices.Equal(got, []string{"pod-x/0011"}) {
		t.Errorf("replica A sees %v after B added GPU", got)
	}
	b.ClearPod(xB)
	if got := holdings(a, podsA, 8); len(got) != 0 {
		t.Errorf("replica A still sees %v after B cleared the pod", got)
	}
}

// TestStaleHoldingsAreReaped: a holding not refreshed for the TTL goes,
// even in a block another pod keeps refreshing; refreshed ones stay.
func TestStaleHoldingsAreReaped(t *testing.T) {
	srv := redistest.Start(t)
	pods := index.NewPods()
	ix := newIndex(t, srv, pods, time.Hour)
	now := time.Unix(1_800_000_000, 0)
	redisindex.SetClock(ix, func() time.Time { return now })
	live, _ := pods.Intern("live")
	dead, _ := pods.Intern("dead")
	must(t, ix.Add(dead, index.GPU, []uint64{1, 2}), ix.Add(live, index.CPU, []uint64{1, 3}))
	now = now.Add(50 * time.Minute)
	must(t, ix.Add(live, index.CPU, []uint64{1}))
	if n, err := ix.Reap(); err != nil || n != 0 {
		t.Fatalf("reap within the TTL: %d, %v", n, err)
	}
	now = now.Add(20 * time.Minute) // dead's and live's block 3 are 70 min old
	n, err := ix.Reap()
	must(t, err)
	if n != 3 {
		t.Errorf("reaped %d holdings, want 3", n)
	}
	for h, want := range map[uint64][]string{1: {"live/0010"}, 2: nil, 3: nil} {
		if got := holdings(ix, pods, h); !slices.Equal(got, want) {
			t.Errorf("block %d: %v, want %v", h, got, want)
		}
	}
	if st := ix.Stats(); st.Reaped != 3 {
		t.Errorf("stats %+v", st)
	}
	// The dead pod left the registry: a clear of it finds nothing.
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer rdb.Close()
	if members, _ := rdb.ZRange(t.Context(), "test:pods", 0, -1).Result(); !slices.Equal(members, []string{"live"}) {
		t.Errorf("registry %v", members)
	}
}

// TestRedisGoingAway: reads fail soft (counted, no holders), writes fail
// with an error, and all works again once Redis is back.
func TestRedisGoingAway(t *testing.T) {
	srv := redistest.Start(t)
	pods := index.NewPods()
	ix := newIndex(t, srv, pods, 0)
	id, _ := pods.Intern("pod-a")
	must(t, ix.Add(id, index.GPU, []uint64{1}))
	srv.Stop()
	if err := ix.Add(id, index.GPU, []uint64{2}); err == nil {
		t.Error("an add with Redis down succeeded")
	}
	if w := ix.HolderWords(1, nil); len(w) != 0 {
		t.Errorf("read with Redis down: %v", w)
	}
	scores, err := ix.ScoreWith(index.BlockHits{}, []uint64{1}, []index.PodID{id}, nil)
	if err == nil || len(scores) != 1 || scores[0].Score != 0 {
		t.Errorf("ScoreWith with Redis down: %v, %v", scores, err)
	}
	if snap, err := ix.Snapshot([]uint64{1}); err == nil || snap == nil {
		t.Errorf("Snapshot with Redis down: %v, %v", snap, err)
	}
	ix.ClearPod(id)
	if st := ix.Stats(); st.ReadErrors != 3 || st.ClearErrors != 1 {
		t.Errorf("stats with Redis down: %+v", st)
	}
	redistest.StartOn(t, srv.Port())             // empty: nothing persisted
	deadline := time.Now().Add(10 * time.Second) // a liveness bound, not a measurement
	for ix.Add(id, index.GPU, []uint64{3}) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the index did not come back with Redis")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := holdings(ix, pods, 3); !slices.Equal(got, []string{"pod-a/0001"}) {
		t.Errorf("after the restart: %v", got)
	}
}

func TestNewChecksConfig(t *testing.T) {
	pods := index.NewPods()
	for _, cfg := range []redisindex.Config{
		{},
		{URL: "http://localhost:6379"},
		{URL: "redis://localhost:6379", Cluster: true, Prefix: "kvtier:"},
	} {
		if _, err := redisindex.New(cfg, pods); !errors.Is(err, redisindex.ErrBadConfig) {
			t.Errorf("%+v: %v, want ErrBadConfig", cfg, err)
		}
	}
	if _, err := redisindex.New(redisindex.Config{URL: "redis://localhost:6379"}, nil); !errors.Is(err, redisindex.ErrBadConfig) {
		t.Errorf("no registry: %v", err)
	}
	for _, cfg := range []redisindex.Config{
		{URL: "redis://localhost:6379/2"},
		{URL: "rediss://u:p@localhost:6379"},
		{URL: "redis://localhost:6379?addr=localhost:6380", Cluster: true},
		{URL: "redis://localhost:6379", Cluster: true, Prefix: "a{t}:"},
	} {
		ix, err := redisindex.New(cfg, pods)
		if err != nil {
			t.Errorf("%+v: %v", cfg, err)
			continue
		}
		ix.Close()
	}
}

// TestURLConfig: an Index opened from a URL works and closes its client.
func TestURLConfig(t *testing.T) {
	srv := redistest.Start(t)
	pods := index.NewPods()
	ix, err := redisindex.New(redisindex.Config{URL: srv.URL()}, pods)
	must(t, err)
	id, _ := pods.Intern("p")
	must(t, ix.Add(id, index.Remote, []uint64{^uint64(0)}))
	if got := holdings(ix, pods, ^uint64(0)); !slices.Equal(got, []string{"p/1000"}) {
		t.Errorf("holders %v", got)
	}
	must(t, ix.Close())
	if err := ix.Add(id, index.GPU, []uint64{1}); err == nil {
		t.Error("an add after Close succeeded")
	}
}
