package tier_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
	"kvtier/tier/disk"
)

// countingDisk is the real disk tier, counting the reads started on it.
type countingDisk struct {
	*disk.Tier
	reads *atomic.Int64
}

func (c countingDisk) OpenRange(ctx context.Context, k chunk.Key, dst []byte) (tier.RangeRead, error) {
	c.reads.Add(1)
	return c.Tier.OpenRange(ctx, k, dst)
}

func (c countingDisk) Get(ctx context.Context, k chunk.Key, dst []byte) (int, error) {
	c.reads.Add(1)
	return c.Tier.Get(ctx, k, dst)
}

// TestAcquireStreamExactRefusesMisfits: a hit of RAM and disk chunks, one
// of which (in RAM leading, in RAM between disk chunks, or on disk) was
// written with a size that does not split into the stated geometry's
// spans, is refused whole with ErrGeometry before any read: nothing is
// read from disk, the RAM chunks keep only their own reference, no
// reservation stays. The same hit without the misfit streams byte-exact.
func TestAcquireStreamExactRefusesMisfits(t *testing.T) {
	for _, c := range []struct {
		name   string
		misfit int
		inRAM  map[int]bool
	}{
		{"leading RAM chunk", 0, map[int]bool{0: true, 1: true}},
		{"RAM chunk between", 2, map[int]bool{0: true, 2: true}},
		{"disk chunk", 3, map[int]bool{0: true, 2: true}},
		{"none", -1, map[int]bool{0: true, 2: true}},
	} {
		t.Run(c.name, func(t *testing.T) { testExactMisfit(t, c.misfit, c.inRAM) })
	}
}

func testExactMisfit(t *testing.T, misfit int, inRAM map[int]bool) {
	ctx := context.Background()
	ram := newRAM(t, 64*geoChunk)
	d := newDisk(t, t.TempDir(), 64<<20)
	keys := make([]chunk.Key, 5)
	chunks := make([][]byte, len(keys))
	for i := range keys {
		keys[i] = key(i)
		size := geoChunk
		if i == misfit {
			size = geoChunk + 8 // 16 spans of 8192.5 bytes
		}
		chunks[i] = payload(i, size)
		if err := d.Put(ctx, keys[i], chunks[i]); err != nil {
			t.Fatal(err)
		}
		if inRAM[i] {
			if err := ram.Put(ctx, keys[i], chunks[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	var reads atomic.Int64
	m, err := tier.NewManager(ram, []tier.Tier{countingDisk{d, &reads}}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	a := m.RAM().Arena()
	before := a.Stats()
	ids := make([]arena.ID, len(keys))
	n, s, err := m.AcquireStreamExact(ctx, keys, ids, testGeo, time.Now().Add(time.Minute))
	if misfit < 0 {
		if err != nil || n != len(keys) || s == nil {
			t.Fatalf("AcquireStreamExact = %d, %v, %v", n, s, err)
		}
		if _, _, err := s.Wait(ctx, testGeo.Layers-1); err != nil {
			t.Fatal(err)
		}
		for layer := range testGeo.Layers {
			checkLayer(t, a, ids, chunks, layer)
		}
		for !s.Done() {
			time.Sleep(time.Millisecond)
		}
		for _, id := range ids {
			a.Unref(id)
		}
		return
	}
	if !errors.Is(err, tier.ErrGeometry) || n != 0 || s != nil {
		t.Fatalf("AcquireStreamExact = %d, %v, %v; want ErrGeometry", n, s, err)
	}
	if r := reads.Load(); r != 0 {
		t.Errorf("%d disk reads started for a refused hit", r)
	}
	after := a.Stats()
	if after.Used != before.Used || after.Objects != before.Objects || a.Pinned() != 0 {
		t.Fatalf("arena before %+v, after %+v, %d bytes pinned", before, after, a.Pinned())
	}
	for i := range keys {
		if m.RAM().Contains(keys[i]) != inRAM[i] {
			t.Fatalf("chunk %d in RAM: %v", i, m.RAM().Contains(keys[i]))
		}
	}
	// A geometry no chunk could have: refused the same way.
	if _, _, err := m.AcquireStreamExact(ctx, keys, ids, tier.LayerGeometry{Layers: 8, Parts: 3}, time.Now().Add(time.Minute)); !errors.Is(err, tier.ErrGeometry) {
		t.Fatalf("three parts: %v", err)
	}
}

// TestAcquireStreamExactChecksBeforeReserving: RAM is full of other
// users' chunks; a hit of one RAM chunk then disk chunks whose last one
// does not split into the stated geometry is refused before the first
// reservation: no other chunk is evicted to make room for chunks that are
// given back at once, the RAM chunks between the disk ones are not
// counted as hits or read bytes, nor moved in the eviction order.
func TestAcquireStreamExactChecksBeforeReserving(t *testing.T) {
	ctx := context.Background()
	const others = 8
	ram := newRAM(t, (others+2)*geoChunk)
	d := newDisk(t, t.TempDir(), 64<<20)
	keys := make([]chunk.Key, 6)
	inRAM := map[int]bool{0: true, 2: true}
	for i := range keys {
		keys[i] = key(i)
		size := geoChunk
		if i == len(keys)-1 {
			size = geoChunk + 8
		}
		b := payload(i, size)
		if err := d.Put(ctx, keys[i], b); err != nil {
			t.Fatal(err)
		}
		if inRAM[i] {
			if err := ram.Put(ctx, keys[i], b); err != nil {
				t.Fatal(err)
			}
		}
	}
	var hot []chunk.Key // fill RAM: any reservation evicts one of them
	for i := range others {
		k := key(1000 + i)
		if err := ram.Put(ctx, k, payload(1000+i, geoChunk)); err != nil {
			t.Fatal(err)
		}
		hot = append(hot, k)
	}
	var reads atomic.Int64
	m, err := tier.NewManager(ram, []tier.Tier{countingDisk{d, &reads}}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	before := m.RAM().Stats()
	ids := make([]arena.ID, len(keys))
	n, s, err := m.AcquireStreamExact(ctx, keys, ids, testGeo, time.Now().Add(time.Minute))
	if !errors.Is(err, tier.ErrGeometry) || n != 0 || s != nil {
		t.Fatalf("AcquireStreamExact = %d, %v, %v; want ErrGeometry", n, s, err)
	}
	after := m.RAM().Stats()
	for _, k := range hot {
		if !m.RAM().Contains(k) {
			t.Fatalf("%v evicted for a refused hit: %+v", k, after)
		}
	}
	// The leading RAM chunk is taken before the geometry is looked at;
	// the one between the disk chunks must not be.
	if after.Evictions != before.Evictions || after.Hits > before.Hits+1 || after.BytesRead > before.BytesRead+geoChunk ||
		after.Used != before.Used || after.Pinned != 0 || reads.Load() != 0 {
		t.Fatalf("refused hit: RAM before %+v, after %+v, %d disk reads", before, after, reads.Load())
	}
}
