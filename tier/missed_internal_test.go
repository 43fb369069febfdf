package tier

import (
	"testing"

	"kvtier/chunk"
)

// TestMissedOverflowByScope: beyond maxMissed keys a missedSet counts by
// scope, so a narrowed Sync still counts only its scopes' chunks; beyond
// maxOverScopes scopes it counts in one figure every Sync reports; a
// cleared scope's count goes.
func TestMissedOverflowByScope(t *testing.T) {
	var s missedSet
	k := func(scope uint64, i int) chunk.Key {
		var key chunk.Key
		key.Scope = scope
		key.Hash[0], key.Hash[1], key.Hash[2] = byte(i), byte(i>>8), byte(i>>16)
		return key
	}
	for i := range maxMissed {
		s.add(k(1, i))
	}
	s.add(k(1, maxMissed))
	s.add(k(2, 0))
	s.add(k(2, 1))
	only := func(sc uint64) func(uint64) bool { return func(x uint64) bool { return x == sc } }
	var gone missedSet
	keys, over, lost := s.take()
	if len(keys) != maxMissed || gone.drain(over, lost) != nil {
		t.Fatalf("take: %d keys", len(keys))
	}
	if a, b, all := gone.overflow(only(1)), gone.overflow(only(2)), gone.overflow(nil); a != 1 || b != 2 || all != 3 {
		t.Fatalf("overflow by scope: 1→%d 2→%d all→%d; want 1, 2, 3", a, b, all)
	}
	for sc := range uint64(maxOverScopes) {
		gone.countOver(100+sc, 1)
	}
	if got := gone.overflow(only(2)); got != 2+2 {
		// scopes 1 and 2 held two of the maxOverScopes places: the last
		// two new scopes fell into the count every Sync reports.
		t.Fatalf("scope 2 with the per-scope counts full: %d; want 4", got)
	}
	gone.forgetScope(2)
	if got := gone.overflow(only(2)); got != 2 {
		t.Fatalf("after clearing scope 2: %d; want the 2 unattributed", got)
	}
	gone.forgetScope(0)
	if got := gone.overflow(nil); got != 0 {
		t.Fatalf("after clearing everything: %d", got)
	}
}
