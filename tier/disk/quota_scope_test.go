package disk

import (
	"testing"

	"kvtier/tier"
)

// TestChargeScopeRecovered: records of two scopes put with no quota, the
// tier reopened on its directory (so they are recovered, charged to no
// one), then given a quota and scope 1 assigned to owner a: ChargeScope
// charges a's recovered records, evicts a's oldest to bring it within
// its quota of four, and leaves scope 2's records alone. Charging again
// changes nothing; a's next put evicts a's own record.
func TestChargeScopeRecovered(t *testing.T) {
	dir := t.TempDir()
	d := openTier(t, dir, Options{Capacity: 64 << 20})
	for i := range 6 {
		mustPut(t, d, quotaKey(1, i), testPayload(quotaKey(1, i), 4096))
	}
	for i := range 3 {
		mustPut(t, d, quotaKey(2, i), testPayload(quotaKey(2, i), 4096))
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d = openTier(t, dir, Options{Capacity: 64 << 20})
	defer d.Close()
	per := recordSize(4096)
	q := tier.NewQuota([]string{"a"}, []int64{4 * per})
	d.SetQuota(q)
	q.Assign(1, "a")
	if st := q.Stats(); st[0].Used != 0 {
		t.Fatalf("assigning alone charged %+v", st)
	}
	d.ChargeScope(1)
	st := q.Stats()
	if st[0].Used != 4*per || st[0].Evictions != 2 {
		t.Fatalf("after ChargeScope: %+v; want 4 records charged, 2 evicted", st)
	}
	held := 0
	for i := range 6 {
		if d.Contains(quotaKey(1, i)) {
			held++
			checkGet(t, d, quotaKey(1, i), testPayload(quotaKey(1, i), 4096))
		}
	}
	if held != 4 {
		t.Fatalf("a holds %d records, want 4", held)
	}
	for i := range 3 {
		checkGet(t, d, quotaKey(2, i), testPayload(quotaKey(2, i), 4096))
	}
	d.ChargeScope(1)
	d.ChargeScope(2) // no owner: nothing to do
	if st := q.Stats(); st[0].Used != 4*per || st[0].Evictions != 2 {
		t.Fatalf("charging again: %+v", st)
	}
	mustPut(t, d, quotaKey(1, 6), testPayload(quotaKey(1, 6), 4096))
	if st := q.Stats(); st[0].Used != 4*per || st[0].Evictions != 3 || !d.Contains(quotaKey(1, 6)) {
		t.Fatalf("a's next put: %+v", st)
	}
	for i := range 3 {
		checkGet(t, d, quotaKey(2, i), testPayload(quotaKey(2, i), 4096))
	}
	if !d.Remove(quotaKey(1, 6)) || q.Stats()[0].Used != 3*per {
		t.Fatalf("a remove gives the bytes back: %+v", q.Stats())
	}
}

// BenchmarkChargeScopeBatch measures one batch of ChargeScope's pass, the
// longest it holds the tier's lock: 4,096 index slots of another scope
// (docs/security.md#quotas quotes it).
func BenchmarkChargeScopeBatch(b *testing.B) {
	d := openTier(b, b.TempDir(), Options{Capacity: 64 << 20})
	defer d.Close()
	q := tier.NewQuota([]string{"a"}, []int64{1 << 20})
	d.SetQuota(q)
	q.Assign(1, "a")
	d.mu.Lock()
	for i := range chargeBatch - len(d.idx.slots) {
		d.idx.slots = append(d.idx.slots, slot{key: quotaKey(2, i), state: slotLive, size: 4096})
	}
	d.mu.Unlock()
	b.ResetTimer()
	for b.Loop() {
		d.ChargeScope(1)
	}
}
