package p2p_test

import (
	"context"
	"testing"
	"time"

	"kvtier/engine"
	"kvtier/tier"
	_ "kvtier/tier/kvtier" // the kvtier:// scheme, the yardstick
	"kvtier/tier/p2p"
	"kvtier/tier/remote"
)

// TestReadAllocsLikeTheKvtierTier holds a P2P read (Size then Get, with
// its lease, checksum and release) to the allocations of the guarded
// kvtier:// tier reading the same chunk from the same daemon: the
// client's per-call costs, and nothing per byte.
func TestReadAllocsLikeTheKvtierTier(t *testing.T) {
	d1 := startDaemon(t, "127.0.0.1:0", engine.Options{})
	store(t, d1, 1, 100_000)
	ctx := context.Background()
	dst := make([]byte, 100_000)
	pt := p2p.NewStatic([]string{d1.addr}, p2p.Options{Token: token, Timeout: time.Second})
	defer pt.Close()
	read := func(size func() (int, bool), get func() (int, error)) func() {
		return func() {
			if _, ok := size(); !ok {
				t.Fatal("not found")
			}
			if _, err := get(); err != nil {
				t.Fatal(err)
			}
		}
	}
	p2pAllocs := testing.AllocsPerRun(100, read(
		func() (int, bool) { return pt.Size(key(0)) },
		func() (int, error) { return pt.Get(ctx, key(0), dst) }))
	kt, err := remote.Open(ctx, "kvtier://"+token+"@"+d1.addr, remote.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	g := remote.Guard(kt, remote.GuardOptions{Timeout: time.Second})
	defer g.Close()
	kvtierAllocs := testing.AllocsPerRun(100, read(
		func() (int, bool) { return g.Size(key(0)) },
		func() (int, error) { return g.Get(ctx, key(0), dst) }))
	t.Logf("allocations per read: p2p %v, kvtier %v", p2pAllocs, kvtierAllocs)
	if p2pAllocs > kvtierAllocs+2 {
		t.Errorf("a P2P read allocates %v times, the kvtier tier's %v", p2pAllocs, kvtierAllocs)
	}
}

// TestPipelinedRangeAllocs holds a pipelined request of a layer's two
// ranges (Send, then Recv) to the allocations of the two one-range
// requests it replaces (ReadRange twice): per request costs only,
// nothing per range or byte.
func TestPipelinedRangeAllocs(t *testing.T) {
	d1 := startDaemon(t, "127.0.0.1:0", engine.Options{})
	const size = 100_000
	store(t, d1, 1, size)
	ctx := context.Background()
	dst := make([]byte, size)
	pt := p2p.NewStatic([]string{d1.addr}, p2p.Options{Token: token, Timeout: time.Second})
	defer pt.Close()
	rr, err := pt.OpenRange(ctx, key(0), dst)
	if err != nil {
		t.Fatal(err)
	}
	defer rr.Close()
	pr, ok := rr.(tier.PipelinedRead)
	if !ok {
		t.Fatal("a P2P range read does not pipeline")
	}
	spans := []tier.Span{{From: 0, To: 1000}, {From: size / 2, To: size/2 + 1000}}
	pipelined := testing.AllocsPerRun(100, func() {
		if err := pr.Send(ctx, spans); err != nil {
			t.Fatal(err)
		}
		if err := pr.Recv(ctx); err != nil {
			t.Fatal(err)
		}
	})
	single := testing.AllocsPerRun(100, func() {
		for _, sp := range spans {
			if err := rr.ReadRange(ctx, sp.From, sp.To); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Logf("allocations per layer: pipelined %v, one range per request %v", pipelined, single)
	if pipelined > single {
		t.Errorf("a pipelined request allocates %v times, two one-range requests %v", pipelined, single)
	}
}
