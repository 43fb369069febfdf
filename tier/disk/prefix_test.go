package disk

import (
	"context"
	"testing"

	"kvtier/tier/policy"
)

// TestPutAfterKeepsChainsClosed is the disk tier's side of prefix-aware
// eviction: a chain put with PutAfter, its head read, then two more
// records. LRU strands the chain's tail; the prefix-aware policies evict
// from the tail (TREELFU, TREESLRU and TREEHD first drop the unreused newcomer),
// and what is left reads back intact.
func TestPutAfterKeepsChainsClosed(t *testing.T) {
	const size = 10000
	for _, tc := range []struct {
		policy string
		want   [4]bool
	}{
		{policy.LRU, [4]bool{true, false, false, true}},
		{policy.TREELRU, [4]bool{true, true, false, false}},
		{policy.TREELFU, [4]bool{true, true, true, false}}, // the new one-off record goes first
		{policy.TREESLRU, [4]bool{true, true, true, false}},
		{policy.TREEHD, [4]bool{true, true, true, false}},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			d := openTier(t, t.TempDir(), Options{Capacity: 4 * recordSize(size), Headroom: -1, Policy: tc.policy})
			defer d.Close()
			for i := range uint64(4) {
				key := testKey(i)
				var err error
				if i == 0 {
					err = d.Put(context.Background(), key, testPayload(key, size))
				} else {
					err = d.PutAfter(context.Background(), key, testKey(i-1), testPayload(key, size))
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			checkGet(t, d, testKey(0), testPayload(testKey(0), size))
			mustPut(t, d, testKey(100), testPayload(testKey(100), size))
			mustPut(t, d, testKey(101), testPayload(testKey(101), size))
			for i, want := range tc.want {
				key := testKey(uint64(i))
				if got := d.Contains(key); got != want {
					t.Fatalf("chain record %d stored = %v, want %v", i, got, want)
				}
				if want {
					checkGet(t, d, key, testPayload(key, size))
				}
			}
		})
	}
}
