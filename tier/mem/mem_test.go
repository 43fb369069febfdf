package mem

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
)

func newTier(t testing.TB, capacity int64, policy string) *Tier {
	t.Helper()
	a, err := arena.New(arena.Options{Capacity: capacity})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	m, err := New(a, policy)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func k(scope uint64, i byte) chunk.Key { return chunk.Key{Scope: scope, Hash: chunk.Hash{i}} }

func TestEvictsByPolicyWhenFull(t *testing.T) {
	m := newTier(t, 4*4096, "LRU")
	ctx := context.Background()
	for i := range byte(4) {
		if err := m.Put(ctx, k(1, i), bytes.Repeat([]byte{i}, 4096)); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 4096)
	if _, err := m.Get(ctx, k(1, 0), buf); err != nil { // 0 becomes most recent
		t.Fatal(err)
	}
	if err := m.Put(ctx, k(1, 9), make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	if !m.Contains(k(1, 0)) || m.Contains(k(1, 1)) {
		t.Fatal("LRU should have evicted key 1, not the just-read key 0")
	}
	st := m.Stats()
	if st.Evictions != 1 || st.Objects != 4 || st.Used > st.Capacity {
		t.Fatalf("stats after one eviction: %+v", st)
	}
}

// TestReferencedObjectsAreNotEvicted checks the only pinning the RAM tier
// has: a reference besides its own, as the engine's leases hold.
func TestReferencedObjectsAreNotEvicted(t *testing.T) {
	m := newTier(t, 2*4096, "LRU")
	if _, ok := tier.Tier(m).(tier.Pinner); ok {
		t.Fatal("the RAM tier is pinned by references under engine leases, so it must not be a tier.Pinner")
	}
	ctx := context.Background()
	m.Put(ctx, k(1, 1), make([]byte, 4096))
	m.Put(ctx, k(1, 2), make([]byte, 4096))
	var ids [3]arena.ID
	if n := m.Acquire([]chunk.Key{k(1, 1), k(1, 2), k(1, 3)}, ids[:]); n != 2 {
		t.Fatalf("Acquire = %d, want the 2 stored leading keys", n)
	}
	err := m.Put(ctx, k(1, 3), make([]byte, 4096))
	if !errors.Is(err, arena.ErrNoSpace) {
		t.Fatalf("Put with everything referenced = %v, want ErrNoSpace", err)
	}
	if !m.Contains(k(1, 1)) || !m.Contains(k(1, 2)) {
		t.Fatal("a referenced object was evicted")
	}
	// Once the holder lets go (its lease ended), the put evicts.
	for _, id := range ids[:2] {
		m.Arena().Unref(id)
	}
	if p := m.Arena().Pinned(); p != 0 {
		t.Fatalf("pinned after the references were dropped = %d", p)
	}
	if err := m.Put(ctx, k(1, 3), make([]byte, 4096)); err != nil {
		t.Fatalf("Put after the references were dropped: %v", err)
	}
}

func TestReserveCommitVisibility(t *testing.T) {
	m := newTier(t, 1<<20, "FIFO")
	id, buf, err := m.Reserve(100)
	if err != nil {
		t.Fatal(err)
	}
	copy(buf, "hello")
	if m.Contains(k(1, 1)) {
		t.Fatal("reserved object visible before commit")
	}
	m.Commit(k(1, 1), id)
	m.Arena().Unref(id)
	got := make([]byte, 100)
	if n, err := m.Get(context.Background(), k(1, 1), got); err != nil || n != 100 || string(got[:5]) != "hello" {
		t.Fatalf("Get = %d %q %v", n, got[:5], err)
	}
	// An uncommitted reservation leaves nothing behind.
	id2, _, _ := m.Reserve(100)
	m.Arena().Unref(id2)
	if m.Stats().Objects != 1 {
		t.Fatalf("objects = %d, want 1", m.Stats().Objects)
	}
	if _, _, err := m.Reserve(2 << 20); !errors.Is(err, tier.ErrTooLarge) {
		t.Fatalf("Reserve beyond capacity = %v, want ErrTooLarge", err)
	}
}

func TestClearByScope(t *testing.T) {
	m := newTier(t, 1<<20, "LRU")
	ctx := context.Background()
	for i := range byte(3) {
		m.Put(ctx, k(1, i), []byte{i})
		m.Put(ctx, k(2, i), []byte{i})
	}
	if n := m.Clear(1); n != 3 {
		t.Fatalf("Clear(1) = %d", n)
	}
	if m.Contains(k(1, 0)) || !m.Contains(k(2, 0)) {
		t.Fatal("Clear(1) removed the wrong scope")
	}
	if n := m.Clear(0); n != 3 || m.Arena().Used() != 0 {
		t.Fatalf("Clear(0) = %d, used %d", n, m.Arena().Used())
	}
}

// TestClearAllResetsTheIndex: Clear(0) drops every object (a reader's
// reference keeps its bytes until it lets go), tells the observer of each,
// and leaves the index at its smallest, not at its peak size; the tier
// works as new afterwards.
func TestClearAllResetsTheIndex(t *testing.T) {
	m := newTier(t, 1<<20, "LRU")
	ctx := context.Background()
	obs := &countObserver{}
	m.SetObserver(obs)
	for i := range 200 {
		if err := m.Put(ctx, chunk.Key{Scope: uint64(1 + i%3), Hash: chunk.Hash{byte(i), byte(i >> 8)}}, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	var held [1]arena.ID
	if m.Acquire([]chunk.Key{{Scope: 1, Hash: chunk.Hash{0}}}, held[:]) != 1 {
		t.Fatal("Acquire missed")
	}
	if n := m.Clear(0); n != 200 {
		t.Fatalf("Clear(0) = %d", n)
	}
	if obs.dropped != 200 {
		t.Fatalf("observer told of %d drops, want 200", obs.dropped)
	}
	if len(m.index.dir) != 1 || len(m.index.dir[0].slots) != minSegSlots || m.index.Len() != 0 {
		t.Fatalf("index after Clear(0): %d segments, %d slots in the first, %d keys",
			len(m.index.dir), len(m.index.dir[0].slots), m.index.Len())
	}
	if m.Arena().Used() == 0 || m.Arena().Bytes(held[0])[0] != 0 {
		t.Fatal("a held object was freed by Clear(0)")
	}
	m.Arena().Unref(held[0])
	if m.Arena().Used() != 0 {
		t.Fatalf("%d bytes used after Clear(0) and the last reference", m.Arena().Used())
	}
	if err := m.Put(ctx, k(1, 1), []byte{1}); err != nil || !m.Contains(k(1, 1)) || m.Clear(0) != 1 {
		t.Fatal("the tier does not work after Clear(0)")
	}
}

type countObserver struct{ admitted, dropped int }

func (o *countObserver) Admitted(string, chunk.Key) { o.admitted++ }
func (o *countObserver) Dropped(string, chunk.Key)  { o.dropped++ }

func TestGetShortBufferAndMiss(t *testing.T) {
	m := newTier(t, 1<<20, "LRU")
	ctx := context.Background()
	m.Put(ctx, k(1, 1), make([]byte, 64))
	if _, err := m.Get(ctx, k(1, 1), make([]byte, 10)); err == nil {
		t.Fatal("short destination accepted")
	}
	if _, err := m.Get(ctx, k(1, 2), make([]byte, 64)); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("miss = %v, want ErrNotFound", err)
	}
	if m.Arena().Pinned() != 0 {
		t.Fatal("failed Get left a pin")
	}
}

func TestUnknownPolicy(t *testing.T) {
	a, _ := arena.New(arena.Options{Capacity: 1 << 20})
	defer a.Close()
	if _, err := New(a, "random"); err == nil {
		t.Fatal("unknown policy accepted")
	}
}
