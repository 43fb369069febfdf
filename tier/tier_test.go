package tier_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/tier"
)

// bareTier has the four methods of tier.Tier and nothing else: no batch
// presence, no removal, no pins, no stats, nothing to close.
type bareTier struct {
	mu    sync.Mutex
	data  map[chunk.Key][]byte
	sizes int // Size calls, to see the fallbacks at work
}

func newBare() *bareTier { return &bareTier{data: map[chunk.Key][]byte{}} }

func (b *bareTier) Name() string { return "bare" }

func (b *bareTier) Size(k chunk.Key) (int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sizes++
	v, ok := b.data[k]
	return len(v), ok
}

func (b *bareTier) Get(_ context.Context, k chunk.Key, dst []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.data[k]
	if !ok {
		return 0, fmt.Errorf("bare: %v: %w", k, tier.ErrNotFound)
	}
	return copy(dst, v), nil
}

func (b *bareTier) Put(_ context.Context, k chunk.Key, data []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.data[k] = append([]byte(nil), data...)
	return nil
}

// pinningTier is a bare tier that can pin, as the disk tier can: it
// records what it was asked.
type pinningTier struct {
	*bareTier
	pinned []chunk.Key
	ttl    time.Duration
}

func (p *pinningTier) Pin(keys []chunk.Key, ttl time.Duration) int {
	n := tier.PrefixContains(p.bareTier, keys)
	p.pinned, p.ttl = append(p.pinned, keys[:n]...), ttl
	return n
}

// TestHelpersAnswerForABareTier checks the default answers the helpers
// give for a tier without the optional interfaces.
func TestHelpersAnswerForABareTier(t *testing.T) {
	b := newBare()
	ctx := context.Background()
	for i := range 3 {
		b.Put(ctx, key(i), payload(i, 10))
	}
	keys := []chunk.Key{key(0), key(1), key(9), key(2)}
	if n := tier.PrefixContains(b, keys); n != 2 || b.sizes != 3 {
		t.Fatalf("PrefixContains = %d after %d Size calls; want 2 after 3 (one per key up to the miss)", n, b.sizes)
	}
	if !tier.Contains(b, key(1)) || tier.Contains(b, key(9)) {
		t.Fatal("Contains disagrees with Size")
	}
	if tier.Remove(b, key(0)) || !tier.Contains(b, key(0)) {
		t.Fatal("a tier that cannot remove reported or did a removal")
	}
	if tier.Pin(b, keys, time.Hour) != 0 {
		t.Fatal("a tier that cannot pin reported pins")
	}
	if st := tier.StatsOf(b); st != (tier.Stats{Name: "bare"}) {
		t.Fatalf("StatsOf = %+v, want the name alone", st)
	}
	if err := tier.Close(b); err != nil {
		t.Fatal(err)
	}
}

// TestHelpersUseTheOptionalInterfaces checks that the helpers call a
// tier's own methods when it has them.
func TestHelpersUseTheOptionalInterfaces(t *testing.T) {
	ram := newRAM(t, 1<<20)
	ctx := context.Background()
	for i := range 3 {
		if err := ram.Put(ctx, key(i), payload(i, 100)); err != nil {
			t.Fatal(err)
		}
	}
	if n := tier.PrefixContains(ram, []chunk.Key{key(0), key(1), key(9)}); n != 2 {
		t.Fatalf("PrefixContains = %d, want 2", n)
	}
	// The RAM tier is held by references under engine leases, not pinned.
	if tier.Pin(ram, []chunk.Key{key(0)}, time.Hour) != 0 || ram.Arena().Pinned() != 0 {
		t.Fatal("the RAM tier pinned: its chunks are held only by references")
	}
	p := &pinningTier{bareTier: newBare()}
	p.Put(ctx, key(0), payload(0, 10))
	if n := tier.Pin(p, []chunk.Key{key(0), key(9)}, time.Hour); n != 1 || len(p.pinned) != 1 || p.ttl != time.Hour {
		t.Fatalf("Pin = %d, tier pinned %v for %v: want the one stored key for an hour", n, p.pinned, p.ttl)
	}
	if !tier.Remove(ram, key(1)) || ram.Contains(key(1)) {
		t.Fatal("Remove did not reach the RAM tier")
	}
	if st := tier.StatsOf(ram); st.Objects != 2 || st.Puts != 3 {
		t.Fatalf("StatsOf = %+v", st)
	}
}

// TestManagerOverABareTier runs a whole hierarchy over a lower tier that
// has only the four methods: writes land in it, a fresh RAM tier finds and
// promotes them, and what it cannot do (remove, clear) it is not asked to.
func TestManagerOverABareTier(t *testing.T) {
	b := newBare()
	ctx := context.Background()
	keys := []chunk.Key{key(0), key(1), key(2)}
	chunks := [][]byte{payload(0, 4096), payload(1, 4096), payload(2, 4096)}
	m, err := tier.NewManager(newRAM(t, 1<<20), []tier.Tier{b}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := m.Store(ctx, keys, chunks); n != 3 || err != nil {
		t.Fatalf("Store = %d, %v", n, err)
	}
	if err := m.Close(); err != nil { // writes the queued chunks, closes nothing of b
		t.Fatal(err)
	}
	if n := tier.PrefixContains(b, keys); n != 3 {
		t.Fatalf("the bare tier holds %d of 3 stored chunks", n)
	}

	m, err = tier.NewManager(newRAM(t, 1<<20), []tier.Tier{b}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if n, byTier, last := m.Lookup(keys); n != 3 || byTier[1] != 3 || last != 1 {
		t.Fatalf("Lookup = %d %v %d; want all 3 from the bare tier", n, byTier, last)
	}
	dst := [][]byte{make([]byte, 4096), make([]byte, 4096), make([]byte, 4096)}
	if n, err := m.Retrieve(ctx, keys, dst); n != 3 || err != nil {
		t.Fatalf("Retrieve = %d, %v", n, err)
	}
	if !m.RAM().Contains(key(0)) || m.Promoted() != 3 {
		t.Fatalf("promoted %d chunks, want 3", m.Promoted())
	}
	if !m.Remove(key(0)) || !tier.Contains(b, key(0)) {
		t.Fatal("Remove should take the chunk out of RAM and leave the bare tier alone")
	}
	removed, notCleared := m.Clear(0)
	if removed[0] != 2 || removed[1] != 0 || !slices.Equal(notCleared, []string{"bare"}) {
		t.Fatalf("Clear = %v, not cleared %v; want RAM cleared and the bare tier named", removed, notCleared)
	}
	if st, _ := m.Stats(); st[1] != (tier.Stats{Name: "bare"}) {
		t.Fatalf("stats of the bare tier = %+v", st[1])
	}
}
