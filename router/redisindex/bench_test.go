package redisindex_test

import (
	"fmt"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/internal/redistest"
	"kvtier/router/index"
)

// The Redis figures are dominated by loopback round trips and Redis's own
// work; BenchmarkRawPing and BenchmarkRawHGetAllPipeline are the baseline
// of the same run, and BenchmarkInMemoryScore the in-memory index.

const (
	benchBlocks = 128
	benchPods   = 8
)

func benchPrompt() []uint64 {
	prompt := make([]uint64, benchBlocks)
	for i := range prompt {
		prompt[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	return prompt
}

func BenchmarkAdd32(b *testing.B) {
	srv := redistest.Start(b)
	pods := index.NewPods()
	ix := newIndex(b, srv, pods, 0)
	id, _ := pods.Intern("pod-0")
	batch := benchPrompt()[:32]
	b.ReportAllocs()
	for b.Loop() {
		if err := ix.Add(id, index.GPU, batch); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkScoreWith128x8(b *testing.B) {
	srv := redistest.Start(b)
	pods := index.NewPods()
	ix := newIndex(b, srv, pods, 0)
	prompt := benchPrompt()
	for p := range benchPods {
		id, _ := pods.Intern(fmt.Sprintf("pod-%d", p))
		if err := ix.Add(id, index.Tier(p%int(index.NumTiers)), prompt); err != nil {
			b.Fatal(err)
		}
	}
	scores := make([]index.PodScore, 0, benchPods)
	scorer := index.TierWeightedPrefix{Weights: index.DefaultTierWeights()}
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if scores, err = ix.ScoreWith(scorer, prompt, nil, scores[:0]); err != nil || len(scores) != benchPods {
			b.Fatal(scores, err)
		}
	}
}

func BenchmarkInMemoryScore128x8(b *testing.B) {
	ix, _ := index.New(index.Config{MaxBlocks: 1 << 16})
	prompt := benchPrompt()
	for p := range benchPods {
		ix.Add(index.PodID(p), index.Tier(p%int(index.NumTiers)), prompt)
	}
	scores := make([]index.PodScore, 0, benchPods)
	scorer := index.TierWeightedPrefix{Weights: index.DefaultTierWeights()}
	b.ReportAllocs()
	for b.Loop() {
		scores = scorer.Score(ix, prompt, nil, scores[:0])
	}
}

func BenchmarkRawPing(b *testing.B) {
	srv := redistest.Start(b)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer rdb.Close()
	b.ReportAllocs()
	for b.Loop() {
		if err := rdb.Ping(b.Context()).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRawHGetAllPipeline reads the same 128 blocks × 8 holders the
// plain way, one pipelined HGETALL per block, without decoding or scoring.
func BenchmarkRawHGetAllPipeline(b *testing.B) {
	srv := redistest.Start(b)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer rdb.Close()
	keys := make([]string, benchBlocks)
	for i, h := range benchPrompt() {
		keys[i] = fmt.Sprintf("raw:b:%016x", h)
		for p := range benchPods {
			rdb.HSet(b.Context(), keys[i], fmt.Sprintf("pod-%d", p), 1)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		pipe := rdb.Pipeline()
		for _, k := range keys {
			pipe.HGetAll(b.Context(), k)
		}
		if _, err := pipe.Exec(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMemoryPerHolding reports Redis's used memory per (block, pod)
// holding for 20k blocks held by 4 pods each, every data structure
// included.
func BenchmarkMemoryPerHolding(b *testing.B) {
	const blocks, holders = 20_000, 4
	for b.Loop() {
		srv := redistest.Start(b)
		rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
		pods := index.NewPods()
		ix := newIndex(b, srv, pods, 0)
		before := usedMemory(b, rdb)
		batch := make([]uint64, 32)
		for p := range holders {
			id, _ := pods.Intern(fmt.Sprintf("vllm-decode-%d-7f9c4d", p))
			for start := 0; start < blocks; start += len(batch) {
				for i := range batch {
					batch[i] = uint64(start+i+1) * 0x9e3779b97f4a7c15
				}
				if err := ix.Add(id, index.GPU, batch); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(usedMemory(b, rdb)-before)/(blocks*holders), "B/holding")
		rdb.Close()
		srv.Stop()
	}
}

func usedMemory(b *testing.B, rdb *goredis.Client) int64 {
	n, err := rdb.MemoryUsage(b.Context(), "x").Result() // warms the connection
	_ = n
	_ = err
	info, err := rdb.InfoMap(b.Context(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	var used int64
	fmt.Sscan(info["Memory"]["used_memory"], &used)
	return used
}
