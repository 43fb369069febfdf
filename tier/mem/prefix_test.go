package mem

import (
	"bytes"
	"context"
	"testing"

	"kvtier/tier/policy"
)

// TestPrefixPolicyKeepsChainsClosed stores a chain of four chunks, reads
// only its head (a hit that refreshes it under any recency policy), then
// stores two unrelated chunks. LRU evicts the middle of the chain and
// strands its tail; a prefix-aware policy, told each chunk's parent by
// CommitAfter, evicts from the tail and keeps the chain a prefix (TREELFU,
// TREESLRU and TREEHD first drop the unreused newcomer).
func TestPrefixPolicyKeepsChainsClosed(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		policy string
		want   [4]bool // which chain chunks are left
	}{
		{policy.LRU, [4]bool{true, false, false, true}},
		{policy.TREELRU, [4]bool{true, true, false, false}},
		{policy.TREELFU, [4]bool{true, true, true, false}}, // the new one-off record goes first
		{policy.TREESLRU, [4]bool{true, true, true, false}},
		{policy.TREEHD, [4]bool{true, true, true, false}},
	} {
		m := newTier(t, 4*4096, tc.policy)
		for i := range byte(4) {
			id, buf, err := m.Reserve(4096)
			if err != nil {
				t.Fatal(err)
			}
			copy(buf, bytes.Repeat([]byte{i}, 4096))
			m.CommitAfter(k(1, i), k(1, i-1), i > 0, id)
			m.Arena().Unref(id)
		}
		buf := make([]byte, 4096)
		if _, err := m.Get(ctx, k(1, 0), buf); err != nil || buf[0] != 0 {
			t.Fatalf("%s: Get head: %v", tc.policy, err)
		}
		for i := range byte(2) {
			if err := m.Put(ctx, k(2, i), make([]byte, 4096)); err != nil {
				t.Fatal(err)
			}
		}
		var got [4]bool
		for i := range got {
			got[i] = m.Contains(k(1, byte(i)))
		}
		if got != tc.want {
			t.Errorf("%s: chain chunks left %v, want %v", tc.policy, got, tc.want)
		}
		for i, left := range got {
			if left {
				if _, err := m.Get(ctx, k(1, byte(i)), buf); err != nil || buf[0] != byte(i) {
					t.Errorf("%s: chunk %d reads back %v, %d", tc.policy, i, err, buf[0])
				}
			}
		}
	}
}
