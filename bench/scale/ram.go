package scale

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier/mem"
)

// pageBytes is the arena page, the smallest object: the measured chunks
// are one page each, so that millions of them fit in a sparse memfd whose
// pages are never touched (only metadata is measured here).
const pageBytes = 4096

// RAMRow is the RAM tier holding Chunks chunks.
type RAMRow struct {
	Chunks     int
	HeapBytes  float64       // Go heap bytes per chunk: index map, policy, arena object table
	Lookup     time.Duration // PrefixContains of a 128-chunk prompt whose chunks are all stored
	LookupBase time.Duration // the same with 128 chunks stored in all
}

// PerKey returns d per looked-up key in nanoseconds.
func PerKey(d time.Duration) float64 { return float64(d.Nanoseconds()) / promptChunks }

// promptChunks is a 32,768-token prompt in 256-token chunks.
const promptChunks = 128

// newRAM returns a RAM tier over a sparse arena of n pages.
func newRAM(n int, policy string) (*mem.Tier, *arena.Arena, error) {
	a, err := arena.New(arena.Options{Capacity: int64(n) * pageBytes, Name: "kvtier-scale"})
	if err != nil {
		return nil, nil, err
	}
	t, err := mem.New(a, policy)
	if err != nil {
		a.Close()
		return nil, nil, err
	}
	return t, a, nil
}

// insert stores chunk keys from..to-1 without touching their pages.
func insert(t *mem.Tier, a *arena.Arena, from, to int) error {
	for i := from; i < to; i++ {
		id, _, err := t.Reserve(pageBytes)
		if err != nil {
			return err
		}
		t.Commit(scaleKey(uint64(i)), id)
		a.Unref(id)
	}
	return nil
}

// RAM fills a RAM tier (default policy) to each count, reporting heap bytes
// per chunk and the latency of a prefix lookup of 128 stored chunks drawn
// at random (so that a large index misses the CPU caches as in service),
// against the same lookup in a tier of 128 chunks.
func RAM(counts []int, policy string, rounds int) ([]RAMRow, error) {
	base, err := lookupTime(promptChunks, policy, rounds)
	if err != nil {
		return nil, err
	}
	var rows []RAMRow
	for _, n := range counts {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		t, a, err := newRAM(n, policy)
		if err != nil {
			return rows, err
		}
		if err := insert(t, a, 0, n); err != nil {
			a.Close()
			return rows, err
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		row := RAMRow{Chunks: n, LookupBase: base}
		row.HeapBytes = (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(n)
		row.Lookup = timeLookups(t, n, rounds)
		runtime.KeepAlive(t)
		a.Close()
		rows = append(rows, row)
	}
	return rows, nil
}

// lookupTime is RAM's lookup in a tier of n chunks.
func lookupTime(n int, policy string, rounds int) (time.Duration, error) {
	t, a, err := newRAM(n, policy)
	if err != nil {
		return 0, err
	}
	defer a.Close()
	if err := insert(t, a, 0, n); err != nil {
		return 0, err
	}
	return timeLookups(t, n, rounds), nil
}

// threadCPU is the calling thread's CPU time. Timing CPU rather than the
// clock keeps other processes on a shared machine out of the figures (not
// their effect on the caches); callers lock their OS thread.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// timeLookups returns the mean CPU time of a 128-key PrefixContains over
// prompts drawn from n stored keys.
func timeLookups(t *mem.Tier, n, rounds int) time.Duration {
	r := rand.New(rand.NewPCG(uint64(n), 5))
	const prompts = 64
	keys := make([][]chunk.Key, prompts)
	for p := range keys {
		keys[p] = make([]chunk.Key, promptChunks)
		for i := range keys[p] {
			keys[p][i] = scaleKey(uint64(r.IntN(n)))
		}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	best := time.Duration(1 << 62)
	for range rounds {
		start := threadCPU()
		const reps = 200
		for i := range reps * prompts {
			if got := t.PrefixContains(keys[i%prompts]); got != promptChunks {
				panic(fmt.Sprintf("scale: lookup found %d of %d stored chunks", got, promptChunks))
			}
		}
		best = min(best, (threadCPU()-start)/(reps*prompts))
	}
	return best
}
