package disk

import (
	"errors"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/tier"
)

func quotaKey(scope uint64, i int) chunk.Key {
	k := testKey(uint64(i))
	k.Scope = scope
	return k
}

// TestQuotaEvictsOwnRecordsOnly: owner a (scope 1) puts more than its
// quota of four records; only a's oldest records go, owner b's (scope 2)
// all read back; with a's records pinned, a's put fails with ErrQuota.
func TestQuotaEvictsOwnRecordsOnly(t *testing.T) {
	d := openTier(t, t.TempDir(), Options{Capacity: 64 << 20})
	defer d.Close()
	per := recordSize(4096)
	q := tier.NewQuota([]string{"a", "b"}, []int64{4 * per, 4 * per})
	q.Assign(1, "a")
	q.Assign(2, "b")
	d.SetQuota(q)
	for i := range 3 {
		mustPut(t, d, quotaKey(2, i), testPayload(quotaKey(2, i), 4096))
	}
	for i := range 10 {
		mustPut(t, d, quotaKey(1, i), testPayload(quotaKey(1, i), 4096))
	}
	for i := range 3 {
		checkGet(t, d, quotaKey(2, i), testPayload(quotaKey(2, i), 4096))
	}
	for i := range 10 {
		if d.Contains(quotaKey(1, i)) != (i >= 6) {
			t.Fatalf("a's record %d held %v; want only 6 to 9", i, d.Contains(quotaKey(1, i)))
		}
	}
	st := q.Stats()
	if st[0].Used != 4*per || st[0].Evictions != 6 || st[1].Used != 3*per {
		t.Fatalf("quota stats %+v", st)
	}
	var keys []chunk.Key
	for i := 6; i < 10; i++ {
		keys = append(keys, quotaKey(1, i))
	}
	if n := d.Pin(keys, time.Minute); n != 4 {
		t.Fatalf("pinned %d", n)
	}
	err := d.Put(t.Context(), quotaKey(1, 10), testPayload(quotaKey(1, 10), 4096))
	if !errors.Is(err, tier.ErrQuota) {
		t.Fatalf("a's put with its quota pinned: %v, want ErrQuota", err)
	}
	mustPut(t, d, quotaKey(2, 3), testPayload(quotaKey(2, 3), 4096))
	if q.Stats()[0].Refused != 1 || !d.Contains(quotaKey(2, 0)) {
		t.Fatalf("after the refusal: %+v", q.Stats())
	}
	if !d.Remove(quotaKey(1, 6)) || q.Stats()[0].Used != 3*per {
		t.Fatalf("a remove gives the bytes back: %+v", q.Stats())
	}
}
