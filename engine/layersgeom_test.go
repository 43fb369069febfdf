package engine_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strconv"
	"strings"
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
	t.Run("RAM only", func(t *testing.T) { testPendingMisfitRefused(t, "") })
	// With a disk tier the hit's RAM chunk goes through the lower tiers'
	// check first (the pushed chunk is on none), then to the pending ones.
	t.Run("with a disk tier", func(t *testing.T) { testPendingMisfitRefused(t, t.TempDir()) })
}

func testPendingMisfitRefused(t *testing.T, diskDir string) {
	e := open(t, 16<<20, diskDir, true)
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
		if g.Layers == 8 && !strings.Contains(err.Error(), "chunk 1 of the hit") { // numbered in the hit, not the pending run
			t.Fatalf("%+v: %v; want the pending chunk named as chunk 1 of the hit", g, err)
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
	if _, _, err := e.PrepareRetrieveLayers(ctx, keys, engine.Layers{Layers: 1, Parts: 1}, 0, slots[:0]); !errors.Is(err, engine.ErrGeometry) ||
		err.Error() != "stated layer geometry refused: 1 part per layer; the scope's layout KV_2LTD has 2 parts" {
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

// storedIn stores one chunk of sc under a prompt made from seed and
// returns its key; the scope is registered as SCOPE registers it.
func storedIn(t *testing.T, e *engine.Engine, sc chunk.Scope, seed uint64) chunk.Key {
	t.Helper()
	if _, err := e.RegisterScope(sc); err != nil {
		t.Fatal(err)
	}
	toks := tokens(chunkTokens, seed)
	req := engine.Request{Scope: sc, Tokens: toks}
	if got, err := e.Store(context.Background(), req, chunksOf(toks, 0, 1)); got != 1 || err != nil {
		t.Fatalf("store: %d, %v", got, err)
	}
	keys, _, _, err := e.Keys(nil, req)
	if err != nil {
		t.Fatal(err)
	}
	return keys[0]
}

// TestStatedGeometryEveryScope: a stated geometry is held against the tag
// of every scope of the keys, not the first key's alone: raw keys may mix
// scopes, and an untagged scope's chunk before a KV_T2D scope's must not
// let the geometry through. A scope the registry has forgotten (it keeps
// the last 4,096 registered) is still checked, and so is a scope the
// engine never saw when the connection says which scope its keys are of.
func TestStatedGeometryEveryScope(t *testing.T) {
	e := open(t, 16<<20, "", false)
	ctx := context.Background()
	untagged := chunk.Scope{Model: "m", WorldSize: 1}
	t2d := chunk.Scope{Model: "m", WorldSize: 1, Format: "bfloat16/KV_T2D"}
	g := engine.Layers{Layers: 1, Parts: 2} // fits every 512-byte chunk
	refused := func(what string, keys []chunk.Key, g engine.Layers) {
		t.Helper()
		slots, id, err := e.PrepareRetrieveLayers(ctx, keys, g, time.Minute, nil)
		if !errors.Is(err, engine.ErrGeometry) || id != 0 || len(slots) != 0 {
			t.Fatalf("%s: %+v, lease %d, %v; want ErrGeometry", what, slots, id, err)
		}
		if p := e.Stats().Arena.PinnedBytes; p != 0 {
			t.Fatalf("%s: %d bytes pinned after the refusal", what, p)
		}
	}
	mixed := []chunk.Key{storedIn(t, e, untagged, 1), storedIn(t, e, t2d, 2)}
	refused("an untagged scope's chunk, then a KV_T2D scope's", mixed, g)
	if _, id, err := e.PrepareRetrieveLayers(ctx, mixed[:1], g, time.Minute, nil); err != nil || id == 0 {
		t.Fatalf("the untagged chunk alone: lease %d, %v", id, err)
	} else {
		e.Release(id)
	}

	for i := range 4100 { // past the registry's bound: it forgets t2d
		if _, err := e.RegisterScope(chunk.Scope{Model: "other", WorldSize: 1, Namespace: strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := e.Scope(mixed[1].Scope); ok {
		t.Fatal("the registry still names the KV_T2D scope")
	}
	refused("a forgotten KV_T2D scope", mixed[1:], g)

	never := []chunk.Key{{Scope: 0x5eed, Hash: chunk.Hash{9}}}
	g.Scope = engine.Scoped{Format: "bfloat16/KV_T2D", Known: true}
	refused("a scope the engine never saw, named by the connection", never, g)
}

// TestTagGeometryDoesNotAllocate: what a short tag (dtype/layout) says is
// parsed once, when the scope's chunker is made, not on every STORE_LAYER
// notice of a feed lease or layers-0 retrieve that reaches a lower tier.
func TestTagGeometryDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	e := open(t, 16<<20, "", false)
	if _, err := e.RegisterScope(scope); err != nil { // as SCOPE does: bfloat16/KV_2LTD
		t.Fatal(err)
	}
	keys := storedKeys(t, e, 4, 8)
	given := engine.Layers{Layers: 4, Parts: 2}
	if geo, ok := e.SaveGeometry(keys, given); !ok || geo.Layers != 4 || geo.Parts != 2 {
		t.Fatalf("save geometry %+v %v", geo, ok)
	}
	if _, ok := e.SaveGeometry(keys, engine.Layers{Layers: 4, Parts: 1}); ok {
		t.Fatal("one part per layer in a KV_2LTD scope")
	}
	save := testing.AllocsPerRun(100, func() { e.SaveGeometry(keys, given) })
	tag := testing.AllocsPerRun(100, func() { e.Geometry(keys) })
	if save != 0 || tag != 0 {
		t.Errorf("a short tag's geometry: %.1f allocations for a save, %.1f for a retrieve; want 0", save, tag)
	}
}

// BenchmarkTagGeometry: the geometry of a save (STORE_LAYER on a feed
// lease) and of a layers-0 retrieve, in a scope with a short tag.
func BenchmarkTagGeometry(b *testing.B) {
	e := open(b, 16<<20, "", false)
	if _, err := e.RegisterScope(scope); err != nil { // as SCOPE does: bfloat16/KV_2LTD
		b.Fatal(err)
	}
	keys := storedKeysTB(b, e, 4, 9)
	given := engine.Layers{Layers: 4, Parts: 2}
	b.ReportAllocs()
	for b.Loop() {
		e.SaveGeometry(keys, given)
		e.Geometry(keys)
	}
}

// TestStatedGeometryRAMMisfit: a hit wholly in RAM whose chunk does not
// split into the stated geometry is refused when its slots are made,
// with nothing left held and the caller's slots as they came.
func TestStatedGeometryRAMMisfit(t *testing.T) {
	e := open(t, 16<<20, "", false)
	keys := storedKeys(t, e, 4, 10) // 512 bytes a chunk
	prior := []engine.Slot{{Offset: 1, Len: 2}}
	slots, id, err := e.PrepareRetrieveLayers(context.Background(), keys, engine.Layers{Layers: 3, Parts: 2}, time.Minute, prior)
	if !errors.Is(err, engine.ErrGeometry) || id != 0 || len(slots) != 1 || slots[0] != prior[0] {
		t.Fatalf("%+v, lease %d, %v; want ErrGeometry and the slots given", slots, id, err)
	}
	if p := e.Stats().Arena.PinnedBytes; p != 0 {
		t.Fatalf("%d bytes pinned after the refusal", p)
	}
}
