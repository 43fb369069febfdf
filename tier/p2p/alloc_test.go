package p2p_test

import (
	"context"
	"testing"
	"time"

	"kvtier/engine"
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
