package policy

import (
	"slices"
	"strings"
	"testing"
)

func mustNew(t testing.TB, name string) Policy[int] {
	t.Helper()
	p, err := New[int](name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// evictAll drains p with no busy keys and returns the victims in order.
func evictAll(p Policy[int]) []int {
	var out []int
	for {
		k, ok := p.Evict(nil)
		if !ok {
			return out
		}
		out = append(out, k)
	}
}

func TestNewNames(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", Default}, {"lru", LRU}, {"tree-lfu", TREELFU}, {"Lfu", LFU}, {"fifo", FIFO}, {"MRU", MRU},
		{"s3fifo", S3FIFO}, {"S3-FIFO", S3FIFO}, {" arc ", ARC},
	} {
		p, err := New[uint64](tc.in)
		if err != nil {
			t.Fatalf("New(%q): %v", tc.in, err)
		}
		if p.Name() != tc.want {
			t.Errorf("New(%q).Name() = %q, want %q", tc.in, p.Name(), tc.want)
		}
	}
	for _, n := range Names() {
		if p, err := New[string](n); err != nil || p.Name() != n {
			t.Errorf("New(%q) = %v, %v; want a policy named %[1]q", n, p, err)
		}
	}
	_, err := New[int]("clock")
	if err == nil {
		t.Fatal("New(clock) succeeded")
	}
	for _, n := range append(Names(), "clock") {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("error %q does not mention %q", err, n)
		}
	}
}

// TestOrder checks each simple policy's victim order on a hand-worked
// sequence: admit 1,2,3,4, then hits on 1, 3, 1.
func TestOrder(t *testing.T) {
	for name, want := range map[string][]int{
		LRU:  {2, 4, 3, 1},
		MRU:  {1, 3, 4, 2},
		FIFO: {1, 2, 3, 4}, // hits change nothing
		LFU:  {2, 4, 3, 1}, // 1 has 3 refs, 3 has 2; 2 and 4 tie, 2 is older
	} {
		p := mustNew(t, name)
		for _, k := range []int{1, 2, 3, 4} {
			p.Admit(k)
		}
		for _, k := range []int{1, 3, 1} {
			p.Access(k)
		}
		if p.Len() != 4 {
			t.Fatalf("%s: Len = %d, want 4", name, p.Len())
		}
		if got := evictAll(p); !slices.Equal(got, want) {
			t.Errorf("%s: evicted %v, want %v", name, got, want)
		}
		if p.Len() != 0 {
			t.Errorf("%s: Len after draining = %d", name, p.Len())
		}
	}
}

func TestLFUTieBreakIsRecency(t *testing.T) {
	p := mustNew(t, LFU)
	for _, k := range []int{1, 2, 3} {
		p.Admit(k)
	}
	p.Access(2) // 2 reaches count 2 before 1 does
	p.Access(1)
	p.Access(3)
	p.Access(3) // 3: count 3
	p.Admit(4)  // 4: count 1
	if got, want := evictAll(p), []int{4, 2, 1, 3}; !slices.Equal(got, want) {
		t.Errorf("evicted %v, want %v", got, want)
	}
}

func TestBusyKeysAreSkippedAndKeepTheirPlace(t *testing.T) {
	for _, name := range Names() {
		p := mustNew(t, name)
		for k := 1; k <= 5; k++ {
			p.Admit(k)
		}
		first, ok := p.Evict(nil)
		if !ok {
			t.Fatalf("%s: nothing to evict", name)
		}
		p.Admit(first) // restore the set; first is now freshly admitted

		// Make everything busy but one key: it must be the victim.
		var spare int
		for k := 1; k <= 5; k++ {
			if k != first {
				spare = k
			}
		}
		k, ok := p.Evict(func(k int) bool { return k != spare })
		if !ok || k != spare {
			t.Errorf("%s: Evict with only %d idle = %d, %v", name, spare, k, ok)
		}
		if _, ok := p.Evict(func(int) bool { return true }); ok {
			t.Errorf("%s: Evict succeeded with every key busy", name)
		}
		if p.Len() != 4 {
			t.Errorf("%s: Len = %d after one eviction of five, want 4", name, p.Len())
		}
	}
}

func TestBusyKeepsPosition(t *testing.T) {
	for name, want := range map[string][]int{LRU: {1, 3, 4}, FIFO: {1, 3, 4}, MRU: {4, 2, 1}, LFU: {1, 3, 4}} {
		p := mustNew(t, name)
		for k := 1; k <= 4; k++ {
			p.Admit(k)
		}
		// The natural victim is busy once; after it becomes idle it is
		// still the first choice.
		natural := want[0]
		k, ok := p.Evict(func(k int) bool { return k == natural })
		if !ok || k == natural {
			t.Fatalf("%s: Evict skipping %d = %d, %v", name, natural, k, ok)
		}
		if got := evictAll(p); !slices.Equal(got, want) {
			t.Errorf("%s: after skipping, evicted %v, want %v", name, got, want)
		}
	}
}

func TestRemoveForgets(t *testing.T) {
	for _, name := range Names() {
		p := mustNew(t, name)
		for k := 1; k <= 4; k++ {
			p.Admit(k)
		}
		p.Access(2)
		p.Remove(2)
		p.Remove(99) // untracked: no effect
		p.Access(2)  // removed: no effect
		if p.Len() != 3 {
			t.Fatalf("%s: Len = %d, want 3", name, p.Len())
		}
		got := evictAll(p)
		slices.Sort(got)
		if !slices.Equal(got, []int{1, 3, 4}) {
			t.Errorf("%s: evicted %v, want 1, 3, 4 in some order", name, got)
		}
	}
}

func TestAdmitTrackedKeyCountsAsAccess(t *testing.T) {
	p := mustNew(t, LRU)
	p.Admit(1)
	p.Admit(2)
	p.Admit(1)
	if p.Len() != 2 {
		t.Fatalf("Len = %d, want 2", p.Len())
	}
	if got := evictAll(p); !slices.Equal(got, []int{2, 1}) {
		t.Errorf("evicted %v, want [2 1]", got)
	}
}

// fill admits keys [from, to) into p, evicting first whenever p holds size
// keys, as an owner with room for size objects would.
func fill(p Policy[int], size, from, to int) {
	for k := from; k < to; k++ {
		if p.Len() >= size {
			p.Evict(nil)
		}
		p.Admit(k)
	}
}

func tracked(p Policy[int], k int) bool {
	switch p := p.(type) {
	case *recency[int]:
		_, ok := p.pool.index[k]
		return ok
	case *lfu[int]:
		_, ok := p.pool.index[k]
		return ok
	case *s3fifo[int]:
		i, ok := p.pool.index[k]
		return ok && p.pool.slots[i].queue != s3Ghost
	case *arc[int]:
		i, ok := p.pool.index[k]
		return ok && p.pool.slots[i].queue <= arcT2
	}
	panic("unknown policy type")
}

func TestS3FIFOEvictsOneHitWondersFirst(t *testing.T) {
	p := mustNew(t, S3FIFO)
	const size = 20
	fill(p, size, 0, size)
	for k := 0; k < 5; k++ { // five hot keys, hit while in the small queue
		p.Access(k)
		p.Access(k)
	}
	// The first five victims are the oldest keys never hit, not the
	// older hot ones.
	for want := 5; want < 10; want++ {
		if k, ok := p.Evict(nil); !ok || k != want {
			t.Fatalf("Evict = %d, %v; want %d", k, ok, want)
		}
	}
	fill(p, size, 1000, 1000+10*size) // a long scan of one-hit wonders
	for k := 0; k < 5; k++ {
		if !tracked(p, k) {
			t.Errorf("hot key %d was evicted by a scan", k)
		}
	}
	lru := mustNew(t, LRU)
	fill(lru, size, 0, size)
	for k := 0; k < 5; k++ {
		lru.Access(k)
	}
	fill(lru, size, 1000, 1000+10*size)
	if tracked(lru, 0) {
		t.Error("LRU kept a hot key through the scan; the comparison above proves nothing")
	}
}

func TestS3FIFOGhostHitGoesToMain(t *testing.T) {
	s := newS3FIFO[int]()
	for k := 0; k < 10; k++ {
		s.Admit(k)
	}
	k, _ := s.Evict(nil)
	if k != 0 {
		t.Fatalf("first victim = %d, want 0", k)
	}
	if i, ok := s.pool.index[0]; !ok || s.pool.slots[i].queue != s3Ghost {
		t.Fatal("victim 0 is not remembered in the ghost queue")
	}
	s.Admit(0)
	if i := s.pool.index[0]; s.pool.slots[i].queue != s3Main {
		t.Error("key readmitted from the ghost queue is not in the main queue")
	}
	s.Remove(0)
	s.Admit(0)
	if i := s.pool.index[0]; s.pool.slots[i].queue != s3Small {
		t.Error("Remove left a ghost: the readmitted key skipped the small queue")
	}
}

func TestS3FIFOGhostIsBounded(t *testing.T) {
	s := newS3FIFO[int]()
	fill(s, 50, 0, 10_000)
	if s.Len() != 50 {
		t.Fatalf("Len = %d, want 50", s.Len())
	}
	if s.ghost.len > 50 || s.ghost.len == 0 {
		t.Errorf("ghost holds %d keys, want 1..50", s.ghost.len)
	}
	if len(s.pool.index) != s.Len()+s.ghost.len {
		t.Errorf("index holds %d keys, want %d", len(s.pool.index), s.Len()+s.ghost.len)
	}
}

func TestARCAdaptsTarget(t *testing.T) {
	a := newARC[int]()
	for k := 1; k <= 4; k++ {
		a.Admit(k)
	}
	// T1 = 4 3 2 1, p = 0: the victim is T1's least recent.
	if k, _ := a.Evict(nil); k != 1 {
		t.Fatalf("victim = %d, want 1", k)
	}
	if a.b1.len != 1 || a.p != 0 {
		t.Fatalf("B1 = %d, p = %d; want 1, 0", a.b1.len, a.p)
	}
	a.Admit(1) // a hit in B1: T1 was too small
	if a.p != 1 {
		t.Errorf("after a B1 hit p = %d, want 1", a.p)
	}
	if i := a.pool.index[1]; a.pool.slots[i].queue != arcT2 {
		t.Error("key readmitted from B1 is not in T2")
	}
	// T1 = 4 3 2 (3 > p = 1): evict 2 into B1. Then T1 = 4 3 is still
	// above p, so 3 goes too. Now |T1| = 1 = p: the victim comes from T2.
	for _, want := range []int{2, 3, 1} {
		if k, _ := a.Evict(nil); k != want {
			t.Fatalf("victim = %d, want %d", k, want)
		}
	}
	a.Admit(1) // a hit in B2: T2 was too small
	if a.p != 0 {
		t.Errorf("after a B2 hit p = %d, want 0", a.p)
	}
	a.Access(4) // 4 moves to T2
	if i := a.pool.index[4]; a.pool.slots[i].queue != arcT2 {
		t.Error("a hit in T1 did not move the key to T2")
	}
}

func TestARCGhostsAreBounded(t *testing.T) {
	a := newARC[int]()
	fill(a, 40, 0, 5000)
	for k := 0; k < 5000; k += 3 { // re-reference some history
		if a.Len() >= 40 {
			a.Evict(nil)
		}
		a.Admit(k)
	}
	c := 40
	if a.Len() != c {
		t.Fatalf("Len = %d, want %d", a.Len(), c)
	}
	if a.t1.len+a.b1.len > c || a.Len()+a.b1.len+a.b2.len > 2*c {
		t.Errorf("directory out of bounds: T1 %d T2 %d B1 %d B2 %d", a.t1.len, a.t2.len, a.b1.len, a.b2.len)
	}
	if a.p < 0 || a.p > c {
		t.Errorf("p = %d, outside 0..%d", a.p, c)
	}
}

// slots returns how many node slots p has ever allocated.
func slots(p Policy[int]) int {
	switch p := p.(type) {
	case *recency[int]:
		return len(p.pool.slots)
	case *lfu[int]:
		return len(p.pool.slots)
	case *s3fifo[int]:
		return len(p.pool.slots)
	case *arc[int]:
		return len(p.pool.slots)
	case *tree[int]:
		return len(p.nodes)
	}
	panic("unknown policy type")
}

func TestSlotsAreReused(t *testing.T) {
	for _, name := range Names() {
		p := mustNew(t, name)
		fill(p, 100, 0, 100)
		before := slots(p)
		for round := 0; round < 5; round++ {
			fill(p, 100, 1000*(round+1), 1000*(round+1)+1000)
		}
		// Ghost entries may at most double the slots; they must not grow
		// with the number of keys ever seen.
		if after := slots(p); after > 2*before+16 {
			t.Errorf("%s: slots grew from %d to %d over 5000 churned keys", name, before, after)
		}
	}
}
