package policy

import (
	"encoding/binary"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kvtier/chunk"
)

// threadCPU is this thread's CPU time so far.
func threadCPU() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_THREAD, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestMeasureEvict prints the thread CPU time of evicting one root and
// admitting another into a full policy of chunk keys, LRU and TREELFU at
// 10k and 1M keys, best of five blocks (docs/scale.md, "Eviction under
// churn"). It measures, never fails: KVTIER_MEASURE=1 go test -run
// TestMeasure -v ./tier/policy
func TestMeasureEvict(t *testing.T) {
	if os.Getenv("KVTIER_MEASURE") == "" {
		t.Skip("a measurement: set KVTIER_MEASURE=1")
	}
	runtime.LockOSThread()
	for _, name := range []string{LRU, TREELFU} {
		for _, size := range []int{10_000, 1_000_000} {
			p, _ := New[chunk.Key](name)
			key := func(n uint64) chunk.Key {
				var k chunk.Key
				binary.LittleEndian.PutUint64(k.Hash[:], n)
				binary.LittleEndian.PutUint64(k.Hash[8:], n*0x9e3779b97f4a7c15)
				return k
			}
			next := uint64(0)
			for ; next < uint64(size); next++ {
				p.Admit(key(next))
			}
			for range 3 * size {
				p.Evict(nil)
				p.Admit(key(next))
				next++
			}
			best := time.Duration(1 << 62)
			for range 5 {
				const m = 200_000
				c0 := threadCPU()
				for range m {
					p.Evict(nil)
					p.Admit(key(next))
					next++
				}
				best = min(best, (threadCPU()-c0)/m)
			}
			t.Logf("%s %d: %d ns per evict+admit (best of 5)", name, size, best.Nanoseconds())
		}
	}
}

// TestMeasureRandomRead prints what one dependent random read costs in
// arrays of 1 to 256 MiB, the price of the cache misses an eviction makes
// (docs/scale.md). It measures, never fails.
func TestMeasureRandomRead(t *testing.T) {
	if os.Getenv("KVTIER_MEASURE") == "" {
		t.Skip("a measurement: set KVTIER_MEASURE=1")
	}
	runtime.LockOSThread()
	for _, mb := range []int{1, 4, 16, 64, 256} {
		n := mb << 20 / 64
		next := make([]int64, n*8) // one int64 per 64-byte line used
		perm := rand.Perm(n)
		for i := range n {
			next[perm[i]*8] = int64(perm[(i+1)%n] * 8)
		}
		best := time.Duration(1 << 62)
		for range 5 {
			const m = 2_000_000
			p := int64(0)
			c0 := threadCPU()
			for range m {
				p = next[p]
			}
			best = min(best, (threadCPU()-c0)/m)
			if p < 0 {
				t.Log(p)
			}
		}
		t.Logf("%d MiB: %d ns per dependent random read (best of 5)", mb, best.Nanoseconds())
	}
}
