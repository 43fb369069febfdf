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

// quotaTier is a 64 KiB RAM tier where scope 1 belongs to owner a and
// scope 2 to owner b, each with a quota of four 4 KiB chunks.
func quotaTier(t testing.TB) (*Tier, *tier.Quota) {
	m := newTier(t, 16*4096, "LRU")
	q := tier.NewQuota([]string{"a", "b"}, []int64{4 * 4096, 4 * 4096})
	q.Assign(1, "a")
	q.Assign(2, "b")
	m.SetQuota(q)
	return m, q
}

func chunkOf(scope uint64, i byte) []byte { return bytes.Repeat([]byte{byte(scope), i}, 2048) }

func TestQuotaEvictsOwnChunksOnly(t *testing.T) {
	m, q := quotaTier(t)
	ctx := context.Background()
	for i := range byte(3) {
		if err := m.Put(ctx, k(2, i), chunkOf(2, i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range byte(10) {
		if err := m.Put(ctx, k(1, i), chunkOf(1, i)); err != nil {
			t.Fatal(err)
		}
		if i == 7 { // a holds 4 to 7; 4 becomes its most recently used
			if _, err := m.Get(ctx, k(1, 4), make([]byte, 4096)); err != nil {
				t.Fatal(err)
			}
		}
	}
	buf := make([]byte, 4096)
	for i := range byte(3) {
		if n, err := m.Get(ctx, k(2, i), buf); err != nil || !bytes.Equal(buf[:n], chunkOf(2, i)) {
			t.Fatalf("b's chunk %d after a filled its quota: %v", i, err)
		}
	}
	var held []byte
	for i := range byte(10) {
		if m.Contains(k(1, i)) {
			held = append(held, i)
		}
	}
	// a keeps its four most recently used chunks: 4 was read after 7
	// was stored, so 8 and 9 evicted 5 and 6 instead.
	if !bytes.Equal(held, []byte{4, 7, 8, 9}) {
		t.Fatalf("a holds chunks %v, want [4 7 8 9]", held)
	}
	st := q.Stats()
	if st[0].Used != 4*4096 || st[0].Evictions != 6 || st[1].Used != 3*4096 || st[1].Evictions != 0 {
		t.Fatalf("quota stats %+v", st)
	}
	if got := m.Stats().Evictions; got != 6 {
		t.Fatalf("tier evictions %d, want 6", got)
	}
}

func TestQuotaFullOfPinnedChunksRefuses(t *testing.T) {
	m, q := quotaTier(t)
	ctx := context.Background()
	keys := k4(1)
	for i, key := range keys {
		if err := m.Put(ctx, key, chunkOf(1, byte(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Put(ctx, k(2, 0), chunkOf(2, 0)); err != nil {
		t.Fatal(err)
	}
	ids := make([]arena.ID, 4)
	if n := m.Acquire(keys, ids); n != 4 {
		t.Fatalf("acquired %d", n)
	}
	err := m.Put(ctx, k(1, 9), chunkOf(1, 9))
	if !errors.Is(err, tier.ErrQuota) {
		t.Fatalf("a's put with its quota full of chunks in use: %v, want ErrQuota", err)
	}
	if m.Contains(k(1, 9)) || !m.Contains(k(2, 0)) || q.Stats()[0].Refused != 1 {
		t.Fatalf("after the refusal: stored %v, b kept %v, stats %+v", m.Contains(k(1, 9)), m.Contains(k(2, 0)), q.Stats())
	}
	// b is not held back by a's full quota.
	if err := m.Put(ctx, k(2, 1), chunkOf(2, 1)); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		m.Arena().Unref(id)
	}
	if err := m.Put(ctx, k(1, 9), chunkOf(1, 9)); err != nil {
		t.Fatalf("a's put once its chunks are released: %v", err)
	}
	if m.Contains(keys[0]) || q.Stats()[0].Used != 4*4096 {
		t.Fatalf("a's oldest chunk should have made room: %+v", q.Stats())
	}
}

func TestQuotaReleasedOnRemoveAndClear(t *testing.T) {
	m, q := quotaTier(t)
	ctx := context.Background()
	for i := range byte(3) {
		if err := m.Put(ctx, k(1, i), chunkOf(1, i)); err != nil {
			t.Fatal(err)
		}
	}
	m.Remove(k(1, 0))
	if got := q.Stats()[0].Used; got != 2*4096 {
		t.Fatalf("used after a remove: %d", got)
	}
	m.Clear(1)
	if got := q.Stats()[0].Used; got != 0 {
		t.Fatalf("used after a clear: %d", got)
	}
	// A chunk larger than the whole quota is refused, not evicting all.
	if err := m.Put(ctx, k(1, 5), make([]byte, 5*4096)); !errors.Is(err, tier.ErrQuota) {
		t.Fatalf("a chunk larger than its owner's quota: %v", err)
	}
}

func k4(scope uint64) []chunk.Key {
	out := make([]chunk.Key, 4)
	for i := range out {
		out[i] = k(scope, byte(i))
	}
	return out
}

// A chunk larger than its owner's whole quota is refused without evicting
// anything: no eviction could make room, and a chunk taken out of the
// index before the refusal would keep its pages for good.
func TestQuotaChunkLargerThanQuotaEvictsNothing(t *testing.T) {
	m, q := quotaTier(t)
	ctx := context.Background()
	for i := range byte(2) {
		if err := m.Put(ctx, k(1, i), chunkOf(1, i)); err != nil {
			t.Fatal(err)
		}
	}
	used := m.Arena().Stats().Used
	big := bytes.Repeat([]byte{7}, 5*4096) // the quota is 4 × 4 KiB
	if err := m.Put(ctx, k(1, 9), big); !errors.Is(err, tier.ErrQuota) {
		t.Fatalf("a chunk larger than the quota: %v, want ErrQuota", err)
	}
	if !m.Contains(k(1, 0)) || !m.Contains(k(1, 1)) || m.Contains(k(1, 9)) {
		t.Fatalf("after the refusal: chunk 0 %v, chunk 1 %v, the big one %v", m.Contains(k(1, 0)), m.Contains(k(1, 1)), m.Contains(k(1, 9)))
	}
	if got := m.Arena().Stats().Used; got != used {
		t.Fatalf("arena use %d after the refusal, want %d", got, used)
	}
	if st := q.Stats()[0]; st.Used != 2*4096 || st.Evictions != 0 {
		t.Fatalf("quota stats %+v", st)
	}
	m.Clear(0)
	if got := m.Arena().Stats().Used; got != 0 {
		t.Fatalf("arena use %d after clearing everything, want 0", got)
	}
}
