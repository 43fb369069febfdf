package policy

import "testing"

// TestGrowSameOrder checks that a policy grown before it is filled evicts
// in exactly the order of one that was not.
func TestGrowSameOrder(t *testing.T) {
	for _, name := range Names() {
		a, b := mustNew(t, name), mustNew(t, name)
		Grow(b, 500)
		for k := range 1000 {
			AdmitAfter(a, k, k-1, k%10 != 0)
			AdmitAfter(b, k, k-1, k%10 != 0)
			if k%7 == 0 {
				a.Access(k / 2)
				b.Access(k / 2)
			}
		}
		for a.Len() > 0 {
			ka, oka := a.Evict(nil)
			kb, okb := b.Evict(nil)
			if ka != kb || oka != okb {
				t.Fatalf("%s: grown policy evicted %d (%v), the other %d (%v)", name, kb, okb, ka, oka)
			}
		}
		if b.Len() != 0 {
			t.Fatalf("%s: grown policy still tracks %d keys", name, b.Len())
		}
	}
}

// TestGrowAlloc checks that admitting the keys a policy was grown for
// allocates nothing: no map growth, no slice growth.
func TestGrowAlloc(t *testing.T) {
	const n = 1000
	for _, name := range Names() {
		p := mustNew(t, name)
		if _, ok := p.(Grower); !ok {
			t.Fatalf("%s is not a Grower", name)
		}
		Grow(p, 2*n+8) // AllocsPerRun runs the function twice
		next := 0
		allocs := testing.AllocsPerRun(1, func() {
			for range n {
				AdmitAfter(p, next, next-1, next%10 != 0)
				next++
			}
		})
		if allocs != 0 || p.Len() != 2*n {
			t.Fatalf("%s: %v allocations admitting %d keys after Grow; %d tracked", name, allocs, n, p.Len())
		}
	}
}
