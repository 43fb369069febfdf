package engine_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kvtier/chunk"
	"kvtier/engine"
)

// TestPendingMisfitRefused: a reader stating a geometry into which a
// chunk still being pushed does not split is refused with ErrGeometry
// before it takes anything: the push counts no reader, and the RAM chunk
// before it is not left referenced. The same reader with a fitting
// geometry takes both.
func TestPendingMisfitRefused(t *testing.T) {
	e := open(t, 16<<20, "", true)
	ctx := context.Background()
	inRAM := chunk.Key{Scope: 7, Hash: chunk.Hash{1}}
	pushed := chunk.Key{Scope: 7, Hash: chunk.Hash{2}}
	// The RAM chunk splits into 16 spans of 512 bytes; the pushed one into
	// 8 spans of 1025 but not into 16.
	const size, pushedSize = 8 * 2 * 512, 8*2*512 + 8
	var stored engine.Writes
	stored.Begin(e)
	if _, err := stored.Reserve(inRAM, size); err != nil {
		t.Fatal(err)
	}
	if err := stored.Commit(); err != nil {
		t.Fatal(err)
	}
	var pending engine.Writes
	pending.Begin(e)
	defer pending.Abort()
	if _, err := pending.Reserve(pushed, pushedSize); err != nil {
		t.Fatal(err)
	}
	src := &neverDone{}
	pending.Publish(pushed, src)
	defer e.Unpublish(pushed)
	keys := []chunk.Key{inRAM, pushed}
	pinned := e.Stats().Arena.PinnedBytes

	// 8 layers of 2 parts fit the RAM chunk, so the refusal is the
	// pending chunk's; 3 layers of 2 parts fit neither.
	for _, g := range []engine.Layers{{Layers: 8, Parts: 2}, {Layers: 3, Parts: 2}} {
		slots, id, err := e.PrepareRetrieveLayers(ctx, keys, g, time.Minute, nil)
		if !errors.Is(err, engine.ErrGeometry) || id != 0 || len(slots) != 0 {
			t.Fatalf("%+v: %+v, lease %d, %v; want ErrGeometry", g, slots, id, err)
		}
		if src.taken != 0 || e.Stats().Arena.PinnedBytes != pinned {
			t.Fatalf("%+v: refused, yet the push counts %d readers and %d bytes are pinned (%d before)", g, src.taken, e.Stats().Arena.PinnedBytes, pinned)
		}
	}
	slots, id, err := e.PrepareRetrieveLayers(ctx, keys, engine.Layers{Layers: 8, Parts: 1}, time.Minute, nil)
	if err != nil || id == 0 || len(slots) != 2 || src.taken != 1 {
		t.Fatalf("fitting geometry: %+v, lease %d, %v, taken %d", slots, id, err, src.taken)
	}
	e.Release(id)
}

// TestStatedGeometryDoesNotAllocate: checking a stated geometry against
// the scope's tag and the chunks' sizes adds no allocation to a
// layerwise lease of RAM chunks.
func TestStatedGeometryDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	e := open(t, 16<<20, "", false)
	if _, err := e.RegisterScope(scope); err != nil { // as SCOPE does: its tag is then known
		t.Fatal(err)
	}
	keys := storedKeys(t, e, 16, 6)
	ctx := context.Background()
	slots := make([]engine.Slot, 0, len(keys))
	cycle := func(g engine.Layers) func() {
		return func() {
			var id engine.LeaseID
			var err error
			slots, id, err = e.PrepareRetrieveLayers(ctx, keys, g, 0, slots[:0])
			if err != nil || len(slots) != len(keys) {
				t.Fatalf("%+v: %d slots, %v", g, len(slots), err)
			}
			e.Release(id)
		}
	}
	stated, tagged := cycle(engine.Layers{Layers: 1, Parts: 2}), cycle(engine.Layers{})
	stated() // the first lease grows the table
	tagged()
	if a, b := testing.AllocsPerRun(100, stated), testing.AllocsPerRun(100, tagged); a != 0 || b != 0 {
		t.Errorf("a layerwise lease: %.1f allocations with a stated geometry, %.1f without; want 0", a, b)
	}
	// A refusal allocates its message, and leaves nothing behind.
	if _, _, err := e.PrepareRetrieveLayers(ctx, keys, engine.Layers{Layers: 1, Parts: 1}, 0, slots[:0]); !errors.Is(err, engine.ErrGeometry) {
		t.Fatalf("one part in a KV_2LTD scope: %v", err)
	}
	if p := e.Stats().Arena.PinnedBytes; p != 0 {
		t.Fatalf("%d bytes pinned after a refusal", p)
	}
}

// BenchmarkStatedGeometry measures what checking a stated geometry adds
// to a layerwise lease of 16 RAM chunks: blocks of leases with a stated
// geometry and blocks with none (the tag's, not looked at for a RAM hit)
// alternate, each timed in the thread's CPU time, and the median ratio of
// paired blocks is reported as stated/none.
func BenchmarkStatedGeometry(b *testing.B) {
	e := open(b, 16<<20, "", false)
	if _, err := e.RegisterScope(scope); err != nil {
		b.Fatal(err)
	}
	keys := storedKeysTB(b, e, 16, 7)
	ctx := context.Background()
	slots := make([]engine.Slot, 0, len(keys))
	block := func(g engine.Layers, n int) time.Duration {
		t0 := threadCPU()
		for range n {
			var id engine.LeaseID
			slots, id, _ = e.PrepareRetrieveLayers(ctx, keys, g, 0, slots[:0])
			e.Release(id)
		}
		return threadCPU() - t0
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	const per = 500
	var ratios []float64
	var stated, none time.Duration
	b.ReportAllocs()
	for b.Loop() {
		s := block(engine.Layers{Layers: 1, Parts: 2}, per)
		n := block(engine.Layers{}, per)
		stated, none = stated+s, none+n
		ratios = append(ratios, float64(s)/float64(n))
	}
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "stated/none")
	b.ReportMetric(float64(stated.Nanoseconds())/float64(b.N*per), "stated-cpu-ns/lease")
	b.ReportMetric(float64(none.Nanoseconds())/float64(b.N*per), "none-cpu-ns/lease")
}

// threadCPU returns the calling thread's CPU time, to the nanosecond
// (getrusage's is counted in scheduler ticks).
func threadCPU() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return time.Duration(ts.Nano())
}

// storedKeysTB is storedKeys for a benchmark.
func storedKeysTB(tb testing.TB, e *engine.Engine, n int, seed uint64) []chunk.Key {
	tb.Helper()
	toks := tokens(n*chunkTokens, seed)
	req := engine.Request{Scope: scope, Tokens: toks}
	if got, err := e.Store(context.Background(), req, chunksOf(toks, 0, n)); got != n || err != nil {
		tb.Fatalf("store: %d, %v", got, err)
	}
	keys, _, _, err := e.Keys(nil, req)
	if err != nil {
		tb.Fatal(err)
	}
	return keys
}
