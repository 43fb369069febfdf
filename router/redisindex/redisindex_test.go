package redisindex_test

import (
	"fmt"
	"kvtier/internal/redistest"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/router/index"
	"kvtier/router/redisindex"
)

// redisServer starts a real redis-server and returns its address and a
// function that stops it.
func redisServer(t *testing.T) (addr string, stop func()) {
	srv := redistest.Start(t)
	return srv.Addr, srv.Stop
}

func newIndex(t *testing.T, addr string, pods *index.Pods) *redisindex.Index {
	t.Helper()
	rdb := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	ix, err := redisindex.New(redisindex.Config{Client: rdb, Prefix: "test:"}, pods)
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
		out = append(out, fmt.Sprintf("%s/%b", name, tiers))
	}
	slices.Sort(out)
	return out
}

// TestMatchesTheInMemoryIndex applies one random sequence of adds,
// removes and clears to the in-memory index and to the Redis one, and
// compares every block's holders and the scores.
func TestMatchesTheInMemoryIndex(t *testing.T) {
	addr, _ := redisServer(t)
	memPods, redisPods := index.NewPods(), index.NewPods()
	mem, _ := index.New(index.Config{MaxBlocks: 1 << 16})
	rix := newIndex(t, addr, redisPods)
	names := []string{"pod-a", "pod-b", "pod-c", "pod-d"}
	for _, n := range names {
		memPods.Intern(n)
		redisPods.Intern(n)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const blocks = 64
	for step := range 400 {
		name := names[rng.IntN(len(names))]
		mid, _ := memPods.ID(name)
		rid, _ := redisPods.ID(name)
		tier := index.Tier(rng.IntN(int(index.NumTiers)))
		var hashes []uint64
		start := rng.IntN(blocks)
		for i := range 1 + rng.IntN(8) {
			hashes = append(hashes, uint64((start+i)%blocks)+1)
		}
		switch op := rng.IntN(10); {
		case op < 6:
			must(t, mem.Add(mid, tier, hashes), rix.Add(rid, tier, hashes))
		case op < 9:
			must(t, mem.Remove(mid, tier, hashes), rix.Remove(rid, tier, hashes))
		case rng.IntN(2) == 0:
			mem.ClearPod(mid)
			rix.ClearPod(rid)
		default:
			must(t, mem.ClearPodTier(mid, tier), rix.ClearPodTier(rid, tier))
		}
		if step%50 == 49 {
			for h := uint64(1); h <= blocks; h++ {
				if a, b := holdings(mem, memPods, h), holdings(rix, redisPods, h); !slices.Equal(a, b) {
					t.Fatalf("step %d, block %d: in memory %v, in Redis %v", step, h, a, b)
				}
			}
		}
	}
	// Scores through a snapshot equal the in-memory ones, by pod name.
	prompt := make([]uint64, blocks)
	for i := range prompt {
		prompt[i] = uint64(i) + 1
	}
	snap, err := rix.Snapshot(prompt)
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range []index.Scorer{index.LongestPrefix{}, index.BlockHits{}, index.TierWeightedPrefix{Weights: index.DefaultTierWeights()}} {
		want := byName(memPods, sc.Score(mem, prompt, nil, nil))
		got := byName(redisPods, sc.Score(snap, prompt, nil, nil))
		if fmt.Sprint(want) != fmt.Sprint(got) {
			t.Errorf("%T: in memory %v, Redis %v", sc, want, got)
		}
	}
	if rix.Errors() != 0 {
		t.Errorf("%d read errors", rix.Errors())
	}
}

func must(t *testing.T, errs ...error) {
	t.Helper()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func byName(pods *index.Pods, scores []index.PodScore) map[string]float64 {
	out := map[string]float64{}
	for _, s := range scores {
		name, _ := pods.Name(s.Pod)
		out[name] = s.Score
	}
	return out
}

// TestReplicasShareOneView: two indexes with their own pod registries on
// one Redis see each other's writes, by pod name.
func TestReplicasShareOneView(t *testing.T) {
	addr, _ := redisServer(t)
	podsA, podsB := index.NewPods(), index.NewPods()
	a, b := newIndex(t, addr, podsA), newIndex(t, addr, podsB)
	podsB.Intern("other") // so the replicas' ids differ
	id, _ := podsA.Intern("pod-x")
	if err := a.Add(id, index.CPU, []uint64{7, 8, 9}); err != nil {
		t.Fatal(err)
	}
	got := holdings(b, podsB, 8)
	if !slices.Equal(got, []string{"pod-x/10"}) {
		t.Fatalf("replica B sees %v", got)
	}
	idB, _ := podsB.ID("pod-x")
	b.ClearPod(idB)
	if got := holdings(a, podsA, 8); len(got) != 0 {
		t.Errorf("replica A still sees %v after B cleared the pod", got)
	}
}

// TestRedisGoingAway: reads fail soft (counted, no holders), writes fail
// with an error, and all works again once Redis is back.
func TestRedisGoingAway(t *testing.T) {
	addr, stop := redisServer(t)
	pods := index.NewPods()
	ix := newIndex(t, addr, pods)
	id, _ := pods.Intern("pod-a")
	must(t, ix.Add(id, index.GPU, []uint64{1}))
	stop()
	if err := ix.Add(id, index.GPU, []uint64{2}); err == nil {
		t.Error("an add with Redis down succeeded")
	}
	if w := ix.HolderWords(1, nil); len(w) != 0 || ix.Errors() == 0 {
		t.Errorf("read with Redis down: %v, %d errors", w, ix.Errors())
	}
	_, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	redistest.StartOn(t, p)
	deadline := time.Now().Add(10 * time.Second)
	for ix.Add(id, index.GPU, []uint64{3}) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the index did not come back with Redis")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := holdings(ix, pods, 3); !slices.Equal(got, []string{"pod-a/1"}) {
		t.Errorf("after the restart: %v", got)
	}
}

// BenchmarkScoreWithSnapshot: one 128-block prompt held by 8 pods, scored
// through a one-pipeline snapshot.
func BenchmarkScoreWithSnapshot(b *testing.B) {
	srv := redistest.Start(b)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer rdb.Close()
	pods := index.NewPods()
	ix, _ := redisindex.New(redisindex.Config{Client: rdb}, pods)
	prompt := make([]uint64, 128)
	for i := range prompt {
		prompt[i] = uint64(i) + 1000
	}
	for p := range 8 {
		id, _ := pods.Intern(fmt.Sprintf("pod-%d", p))
		if err := ix.Add(id, index.GPU, prompt); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		snap, err := ix.Snapshot(prompt)
		if err != nil {
			b.Fatal(err)
		}
		if s := (index.LongestPrefix{}).Score(snap, prompt, nil, nil); len(s) != 8 {
			b.Fatal(s)
		}
	}
}
