package scale

import (
	"fmt"
	"runtime"
	"time"

	"kvtier/router/index"
)

// RouterRow is the router's block index holding Blocks blocks spread over
// Pods pods, each block held by one pod, plus one 128-block prompt that
// every pod holds.
type RouterRow struct {
	Blocks     int
	Pods       int
	HeapBytes  float64       // heap bytes per block
	Score      time.Duration // LongestPrefix score of the prompt over all pods
	ScoreSmall time.Duration // the same in an index of the prompt alone (baseline)
}

// Router builds an index of each size and scores a 128-block prompt that
// all pods hold in full, the most work a score does.
func Router(counts []int, pods, rounds int) ([]RouterRow, error) {
	base, err := routerScore(0, pods, rounds, nil)
	if err != nil {
		return nil, err
	}
	var rows []RouterRow
	for _, n := range counts {
		row := RouterRow{Blocks: n, Pods: pods, ScoreSmall: base}
		if row.Score, err = routerScore(n, pods, rounds, &row.HeapBytes); err != nil {
			return rows, err
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// routerScore builds an index of n background blocks and the prompt and
// returns the best mean CPU time of a score; heap, if set, gets heap bytes per block.
func routerScore(n, pods, rounds int, heap *float64) (time.Duration, error) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	// Room to spare: a shard full before the index is evicts.
	ix, err := index.New(index.Config{MaxBlocks: (n+promptChunks)*5/4 + 1024})
	if err != nil {
		return 0, err
	}
	batch := make([]uint64, 1024)
	for done := 0; done < n; done += len(batch) {
		b := batch[:min(len(batch), n-done)]
		for i := range b {
			b[i] = uint64(done+i)*0x9e3779b97f4a7c15 | 1
		}
		if err := ix.Add(index.PodID(done/len(batch)%pods), index.CPU, b); err != nil {
			return 0, err
		}
	}
	prompt := make([]uint64, promptChunks)
	for i := range prompt {
		prompt[i] = uint64(i)*0x2545f4914f6cdd1d + 2
	}
	for p := range pods {
		if err := ix.Add(index.PodID(p), index.GPU, prompt); err != nil {
			return 0, err
		}
	}
	if heap != nil {
		runtime.GC()
		runtime.ReadMemStats(&after)
		*heap = (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(n+promptChunks)
	}
	dst := make([]index.PodScore, 0, pods)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	best := time.Duration(1 << 62)
	for range rounds {
		const reps = 2000
		start := threadCPU()
		for range reps {
			dst = index.LongestPrefix{}.Score(ix, prompt, nil, dst[:0])
		}
		best = min(best, (threadCPU()-start)/reps)
	}
	if st := ix.Stats(); st.Evictions != 0 || st.Blocks != n+promptChunks {
		return 0, fmt.Errorf("scale: router index holds %d of %d blocks", st.Blocks, n+promptChunks)
	}
	if len(dst) != pods || dst[0].Score != promptChunks {
		return 0, fmt.Errorf("scale: router scores %v, want %d pods at %d", dst[:min(len(dst), 3)], pods, promptChunks)
	}
	return best, nil
}
