package index

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
)

const (
	promptBlocks = 128 // 2,048 tokens in 16-token blocks
	scorePods    = 8
)

// backgroundBlocks fills ix with n unrelated single-holder blocks so that
// benchmarks run against a realistically large table, not a cache-hot toy.
func backgroundBlocks(tb testing.TB, ix *Index, n int) {
	batch := make([]uint64, 1024)
	for done := 0; done < n; done += len(batch) {
		for i := range batch {
			batch[i] = uint64(done+i)<<1 | 1<<63
		}
		mustAdd(tb, ix, PodID(done%64)+100, CPU, batch...)
	}
}

func scoreIndex(b *testing.B) (*Index, []uint64) {
	ix := newIndex(b, 1<<20+promptBlocks*scorePods, 0)
	backgroundBlocks(b, ix, 1<<20)
	hashes := make([]uint64, promptBlocks)
	for i := range hashes {
		hashes[i] = uint64(i)*0x9e3779b97f4a7c15 + 777
	}
	for p := range PodID(scorePods) {
		mustAdd(b, ix, p, GPU, hashes...)
	}
	return ix, hashes
}

// BenchmarkScore scores a 128-block prompt that 8 pods hold in full, in an
// index of 1 M other blocks: llm-d's ScoreTokens at 2,048 tokens.
func BenchmarkScore(b *testing.B) {
	ix, hashes := scoreIndex(b)
	scorers := []struct {
		name string
		s    Scorer
	}{
		{"LongestPrefix", LongestPrefix{}},
		{"TierWeightedPrefix", TierWeightedPrefix{DefaultTierWeights()}},
		{"BlockHits", BlockHits{}},
	}
	for _, sc := range scorers {
		b.Run(sc.name+"/serial", func(b *testing.B) {
			dst := make([]PodScore, 0, 64)
			b.ReportAllocs()
			for b.Loop() {
				dst = sc.s.Score(ix, hashes, nil, dst[:0])
			}
			if len(dst) != scorePods || dst[0].Score == 0 {
				b.Fatalf("scores %v", dst)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*promptBlocks), "ns/block")
		})
		b.Run(sc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				dst := make([]PodScore, 0, 64)
				for pb.Next() {
					dst = sc.s.Score(ix, hashes, nil, dst[:0])
				}
			})
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*promptBlocks), "ns/block")
		})
	}
	b.Run("LongestPrefix/candidates", func(b *testing.B) {
		cands := []PodID{0, 2, 4, 6, 200}
		dst := make([]PodScore, 0, 64)
		b.ReportAllocs()
		for b.Loop() {
			dst = LongestPrefix{}.Score(ix, hashes, cands, dst[:0])
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*promptBlocks), "ns/block")
	})
}

// BenchmarkAdd adds 128-block batches (one BlockStored event each) to an
// index of 1 M blocks:
//   - fresh: new blocks below the bound (tables grow as needed);
//   - evicting: new blocks at the bound, so each one also evicts one;
//   - refresh: blocks already held by the pod;
//   - 4pods: fresh blocks then the same blocks for three more pods.
func BenchmarkAdd(b *testing.B) {
	const background = 1 << 20
	newBatch := func(next *uint64) []uint64 {
		batch := make([]uint64, promptBlocks)
		for i := range batch {
			batch[i] = *next
			*next++
		}
		return batch
	}
	b.Run("fresh", func(b *testing.B) {
		// Room for ~15 M more blocks: more than a default run adds.
		ix := newIndex(b, 1<<24, 0)
		backgroundBlocks(b, ix, background)
		next := uint64(0)
		batch := newBatch(&next)
		b.ReportAllocs()
		for b.Loop() {
			for i := range batch {
				batch[i] = next
				next++
			}
			mustAdd(b, ix, 1, GPU, batch...)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*promptBlocks), "ns/block")
		if st := ix.Stats(); st.Evictions != 0 {
			b.Fatalf("fresh adds evicted: %+v", st)
		}
	})
	b.Run("evicting", func(b *testing.B) {
		ix := newIndex(b, background, 0)
		backgroundBlocks(b, ix, background)
		next := uint64(0)
		batch := newBatch(&next)
		b.ReportAllocs()
		for b.Loop() {
			for i := range batch {
				batch[i] = next
				next++
			}
			mustAdd(b, ix, 1, GPU, batch...)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*promptBlocks), "ns/block")
		if st := ix.Stats(); st.Evictions == 0 {
			b.Fatalf("no evictions: %+v", st)
		}
	})
	b.Run("refresh", func(b *testing.B) {
		ix := newIndex(b, background, 0)
		backgroundBlocks(b, ix, background)
		batch := make([]uint64, promptBlocks)
		r := uint64(1)
		b.ReportAllocs()
		for b.Loop() {
			for i := range batch {
				r = r*6364136223846793005 + 1442695040888963407
				batch[i] = (r>>44)<<1 | 1<<63 // a background block
			}
			mustAdd(b, ix, 100, CPU, batch...)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*promptBlocks), "ns/block")
	})
	b.Run("4pods", func(b *testing.B) {
		ix := newIndex(b, 2*background, 0)
		backgroundBlocks(b, ix, background)
		next := uint64(0)
		b.ReportAllocs()
		for b.Loop() {
			b.StopTimer()
			batch := newBatch(&next)
			b.StartTimer()
			for p := range PodID(4) {
				mustAdd(b, ix, p, GPU, batch...)
			}
			b.StopTimer()
			ix.Remove(0, GPU, batch)
			ix.Remove(1, GPU, batch)
			ix.Remove(2, GPU, batch)
			ix.Remove(3, GPU, batch)
			b.StartTimer()
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*promptBlocks*4), "ns/block")
	})
	b.Run("fresh/preallocated", func(b *testing.B) {
		ix, err := New(Config{MaxBlocks: 1 << 24, Preallocate: true})
		if err != nil {
			b.Fatal(err)
		}
		backgroundBlocks(b, ix, background)
		next := uint64(0)
		batch := newBatch(&next)
		b.ReportAllocs()
		for b.Loop() {
			for i := range batch {
				batch[i] = next
				next++
			}
			mustAdd(b, ix, 1, GPU, batch...)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*promptBlocks), "ns/block")
	})
	b.Run("evicting/parallel", func(b *testing.B) {
		ix := newIndex(b, background, 0)
		backgroundBlocks(b, ix, background)
		var workers atomic.Uint64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			batch := make([]uint64, promptBlocks)
			next := workers.Add(1) << 48 // disjoint hash ranges per worker
			for pb.Next() {
				for i := range batch {
					batch[i] = next
					next++
				}
				if err := ix.Add(1, GPU, batch); err != nil {
					b.Error(err) // not b.Fatal: RunParallel's goroutines are not the benchmark's
					return
				}
			}
		})
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*promptBlocks), "ns/block")
	})
}

// BenchmarkClearPod times the full-table scan of ClearPod on an index of
// 1 M blocks held by 4 pods; the cleared pod holds nothing, so every
// iteration scans the same tables.
func BenchmarkClearPod(b *testing.B) {
	ix := newIndex(b, 1<<20, 0)
	batch := make([]uint64, 1024)
	for done := 0; done < 1<<20; done += len(batch) {
		for i := range batch {
			batch[i] = uint64(done + i)
		}
		for p := range PodID(4) {
			mustAdd(b, ix, p, GPU, batch...)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		ix.ClearPod(99)
	}
	if st := ix.Stats(); st.Entries != 4<<20 {
		b.Fatalf("stats %+v", st)
	}
}

// heapPerEntry builds an index of blocks blocks each held by pods pods and
// returns the heap growth per (block, pod) entry and per block.
func heapPerEntry(tb testing.TB, blocks, pods int) (perEntry, perBlock float64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ix := newIndex(tb, blocks, 0)
	batch := make([]uint64, 1024)
	for done := 0; done < blocks; done += len(batch) {
		for i := range batch {
			batch[i] = uint64(done + i)
		}
		for p := range PodID(pods) {
			mustAdd(tb, ix, p, Tier(int(p)%int(NumTiers)), batch[:min(len(batch), blocks-done)]...)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	st := ix.Stats()
	if st.Blocks != blocks || st.Entries != blocks*pods {
		tb.Fatalf("stats %+v, want %d blocks × %d pods", st, blocks, pods)
	}
	grown := float64(after.HeapAlloc) - float64(before.HeapAlloc)
	runtime.KeepAlive(ix)
	return grown / float64(st.Entries), grown / float64(st.Blocks)
}

// BenchmarkMemory reports heap bytes per (block, pod) entry at 1 M blocks.
// Run with -benchtime=1x: each iteration builds a whole index.
func BenchmarkMemory(b *testing.B) {
	for _, pods := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("blocks=1M/pods=%d", pods), func(b *testing.B) {
			var perEntry, perBlock float64
			for b.Loop() {
				perEntry, perBlock = heapPerEntry(b, 1<<20, pods)
			}
			b.ReportMetric(perEntry, "bytes/entry")
			b.ReportMetric(perBlock, "bytes/block")
		})
	}
}

func TestMemoryPerEntry(t *testing.T) {
	for _, pods := range []int{1, 4} {
		perEntry, _ := heapPerEntry(t, 1<<18, pods)
		if perEntry > 100 {
			t.Errorf("%d pods: %.1f heap bytes per (block, pod) entry, want ≤ 100", pods, perEntry)
		}
		t.Logf("%d pods: %.1f bytes per entry", pods, perEntry)
	}
}
