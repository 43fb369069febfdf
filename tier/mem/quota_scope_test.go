package mem

import (
	"bytes"
	"context"
	"testing"

	"kvtier/tier"
)

// TestChargeScopeHeld: chunks stored before their scope had an owner are
// charged by ChargeScope, the owner trimmed to its quota (its least
// recently used first), another scope's chunks untouched.
func TestChargeScopeHeld(t *testing.T) {
	m := newTier(t, 16*4096, "LRU")
	q := tier.NewQuota([]string{"a"}, []int64{4 * 4096})
	m.SetQuota(q)
	ctx := context.Background()
	for i := range byte(6) {
		if err := m.Put(ctx, k(1, i), chunkOf(1, i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range byte(3) {
		if err := m.Put(ctx, k(2, i), chunkOf(2, i)); err != nil {
			t.Fatal(err)
		}
	}
	q.Assign(1, "a")
	m.ChargeScope(1)
	if st := q.Stats(); st[0].Used != 4*4096 || st[0].Evictions != 2 {
		t.Fatalf("after ChargeScope: %+v", st)
	}
	held := 0
	buf := make([]byte, 4096)
	for i := range byte(6) {
		if m.Contains(k(1, i)) {
			held++
			if n, err := m.Get(ctx, k(1, i), buf); err != nil || !bytes.Equal(buf[:n], chunkOf(1, i)) {
				t.Fatalf("a's chunk %d: %v", i, err)
			}
		}
	}
	if held != 4 {
		t.Fatalf("a holds %d chunks, want 4", held)
	}
	for i := range byte(3) {
		if n, err := m.Get(ctx, k(2, i), buf); err != nil || !bytes.Equal(buf[:n], chunkOf(2, i)) {
			t.Fatalf("the other scope's chunk %d: %v", i, err)
		}
	}
	m.ChargeScope(1)
	if st := q.Stats(); st[0].Used != 4*4096 || st[0].Evictions != 2 {
		t.Fatalf("charging again: %+v", st)
	}
	if err := m.Put(ctx, k(1, 9), chunkOf(1, 9)); err != nil {
		t.Fatal(err)
	}
	if st := q.Stats(); st[0].Used != 4*4096 || st[0].Evictions != 3 {
		t.Fatalf("a's next put: %+v", st)
	}
}

// BenchmarkChargeScopeScan measures ChargeScope's hold of the lock over
// a RAM tier of 20,000 chunks none of which is the scope's: one scan of
// the index (docs/security.md#quotas quotes it).
func BenchmarkChargeScopeScan(b *testing.B) {
	const n = 20_000
	m := newTier(b, n*4096, "LRU")
	q := tier.NewQuota([]string{"a"}, []int64{1 << 20})
	m.SetQuota(q)
	q.Assign(1, "a")
	data := make([]byte, 64)
	for i := range n {
		key := k(2, 0)
		key.Hash[1], key.Hash[2], key.Hash[3] = byte(i), byte(i>>8), byte(i>>16)
		if err := m.Put(context.Background(), key, data); err != nil {
			b.Fatal(err)
		}
	}
	if got := m.Stats().Objects; got != n {
		b.Fatalf("the tier holds %d chunks, want %d", got, n)
	}
	b.ResetTimer()
	for b.Loop() {
		m.ChargeScope(1)
	}
}
