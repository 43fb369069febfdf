package policy

import (
	"math/rand/v2"
	"testing"
)

var treeNames = []string{TREELRU, TREELFU, TREEHD, TREESLRU, TREERP}

// treeModel is the naive reference of the prefix forest: each tracked key
// and its tracked parent.
type treeModel map[int]int // key -> parent (-1: root)

func (m treeModel) hasChild(k int) bool {
	for _, p := range m {
		if p == k {
			return true
		}
	}
	return false
}

// canAdopt reports whether k is a tracked root that q, tracked, may take
// as its child: q does not descend from k.
func (m treeModel) canAdopt(k, q int) bool {
	pk, ok := m[k]
	if _, qok := m[q]; !ok || !qok || pk != -1 {
		return false
	}
	for a := q; a != -1; a = m[a] {
		if a == k {
			return false
		}
	}
	return true
}

// remove forgets k; its children become roots.
func (m treeModel) remove(k int) {
	delete(m, k)
	for c, p := range m {
		if p == k {
			m[c] = -1
		}
	}
}

// runTree interprets ops against every prefix-aware policy and checks the
// invariants: Evict takes a tracked idle key, fails only when every key
// is busy, and takes a key with tracked children only when every leaf is
// busy — so the cache stays closed under prefixes whenever it can.
func runTree(t *testing.T, ops []byte) {
	for _, name := range treeNames {
		p := mustNewPrefixed(t, name)
		m := treeModel{}
		for j := 0; j+2 < len(ops); j += 3 {
			op, k, q := ops[j]%9, int(ops[j+1])%32, int(ops[j+2])%32
			switch op {
			case 0, 1, 2: // admit k under q when q is tracked, else as a root
				if _, ok := m[k]; ok {
					p.Access(k)
					continue
				}
				_, ok := m[q]
				switch {
				case op == 1: // naming q whether tracked or not
					if linked := p.(Adopter[int]).AdmitChildLinked(k, q); linked != (ok && q != k) {
						t.Fatalf("%s op %d: AdmitChildLinked(%d, %d) = %v", name, j/3, k, q, linked)
					}
					m[k] = -1
					if ok && q != k {
						m[k] = q
					}
				case ok && q != k && op != 0:
					p.AdmitChild(k, q)
					m[k] = q
				default:
					p.Admit(k)
					m[k] = -1
				}
			case 8: // link k under q afterwards
				want := m.canAdopt(k, q)
				if got := p.(Adopter[int]).Adopt(k, q); got != want {
					t.Fatalf("%s op %d: Adopt(%d, %d) = %v, want %v", name, j/3, k, q, got, want)
				}
				if want {
					m[k] = q
				}
			case 3, 4:
				p.Access(k)
			case 5:
				p.Remove(k)
				m.remove(k)
			default: // q's bits say which keys (mod 5) are busy
				busy := func(k int) bool { return q>>(k%5)&1 == 1 }
				want, determined := lowestIdleLeaf(p, busy)
				got, ok := p.Evict(busy)
				if determined && (!ok || got != want) {
					t.Fatalf("%s op %d: evicted %d (%v), want the idle leaf of lowest rank %d", name, j/3, got, ok, want)
				}
				idle, idleLeaf := false, false
				for r := range m {
					idle = idle || !busy(r)
					idleLeaf = idleLeaf || !busy(r) && !m.hasChild(r)
				}
				_, tracked := m[got]
				switch {
				case ok != idle:
					t.Fatalf("%s op %d: Evict ok = %v with idle keys present = %v", name, j/3, ok, idle)
				case ok && !tracked:
					t.Fatalf("%s op %d: evicted untracked key %d", name, j/3, got)
				case ok && busy(got):
					t.Fatalf("%s op %d: evicted busy key %d", name, j/3, got)
				case ok && idleLeaf && m.hasChild(got):
					t.Fatalf("%s op %d: evicted %d, which has children, while an idle leaf was left", name, j/3, got)
				}
				if ok {
					m.remove(got)
				}
			}
			checkLeaves(t, p)
			if p.Len() != len(m) {
				t.Fatalf("%s op %d: Len = %d, want %d", name, j/3, p.Len(), len(m))
			}
		}
	}
}

func mustNewPrefixed(t testing.TB, name string) Prefixed[int] {
	p, err := New[int](name)
	if err != nil {
		t.Fatal(err)
	}
	pp, ok := p.(Prefixed[int])
	if !ok {
		t.Fatalf("%s is not Prefixed", name)
	}
	return pp
}

func TestTreeInvariants(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 300 {
		ops := make([]byte, 3*(50+r.IntN(400)))
		for i := range ops {
			ops[i] = byte(r.UintN(256))
		}
		runTree(t, ops)
	}
}

func FuzzTreePolicies(f *testing.F) {
	f.Add([]byte{0, 1, 0, 1, 2, 1, 1, 3, 2, 7, 0, 0, 7, 0, 31, 5, 1, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 6144 {
			ops = ops[:6144]
		}
		runTree(t, ops)
	})
}

// TestTreeEvictsChainsFromTheTail admits chains and checks that eviction
// eats each chain from its end: a key never goes while its child stays.
func TestTreeEvictsChainsFromTheTail(t *testing.T) {
	for _, name := range treeNames {
		p := mustNewPrefixed(t, name)
		const chains, length = 20, 10
		for c := range chains {
			p.Admit(c * 100)
			for d := 1; d < length; d++ {
				p.AdmitChild(c*100+d, c*100+d-1)
			}
		}
		gone := map[int]bool{}
		for range chains * length {
			k, ok := p.Evict(nil)
			if !ok {
				t.Fatalf("%s: Evict failed with keys left", name)
			}
			if d := k % 100; d < length-1 && !gone[k+1] {
				t.Fatalf("%s: evicted %d before its child %d", name, k, k+1)
			}
			gone[k] = true
		}
		if p.Len() != 0 {
			t.Fatalf("%s: Len = %d after evicting everything", name, p.Len())
		}
	}
}

// TestTreeLRUOrder checks TREELRU's ranking where the sample sees every
// leaf: the least recently used leaf goes first.
func TestTreeLRUOrder(t *testing.T) {
	p := mustNewPrefixed(t, TREELRU)
	for k := range 8 {
		p.Admit(k)
	}
	p.Access(0)
	p.Access(1)
	for _, want := range []int{2, 3, 4, 5, 6, 7, 0, 1} {
		if got, _ := p.Evict(nil); got != want {
			t.Fatalf("Evict = %d, want %d", got, want)
		}
	}
}

// TestTreeLFUKeepsReusedLeaves: in a full cache taking one-off keys, a
// leaf hit twice outlives two passes of them where TREELRU drops it in the
// first.
func TestTreeLFUKeepsReusedLeaves(t *testing.T) {
	const size = 64
	for _, tc := range []struct {
		name      string
		survivals int // one-off admissions the reused key must outlive
		survives  bool
	}{{TREELFU, 2 * size, true}, {TREELRU, size, false}} {
		p := mustNewPrefixed(t, tc.name)
		p.Admit(1000)
		p.Access(1000)
		p.Access(1000)
		for k := range size - 1 {
			p.Admit(k)
		}
		survived := true
		for k := size; k < size+tc.survivals; k++ {
			if v, _ := p.Evict(nil); v == 1000 {
				survived = false
			}
			p.Admit(k)
		}
		if survived != tc.survives {
			t.Errorf("%s: reused key survived %d one-off admissions: %v, want %v", tc.name, tc.survivals, survived, tc.survives)
		}
	}
}

// TestTreeAllocs checks that admitting under a parent, hitting and evicting
// allocate nothing once the slices have grown.
func TestTreeAllocs(t *testing.T) {
	for _, name := range treeNames {
		p := mustNewPrefixed(t, name)
		next := 0
		step := func() {
			p.Evict(nil)
			if next%8 == 0 {
				p.Admit(next)
			} else {
				p.AdmitChild(next, next-1)
				p.Access(next - 1)
			}
			next++
		}
		for range 1 << 12 {
			p.Admit(next)
			next++
		}
		for range 1 << 14 {
			step()
		}
		if a := testing.AllocsPerRun(1000, step); a > 0.01 {
			t.Errorf("%s: %.2f allocations per admit+evict", name, a)
		}
	}
}

// TestSLRUProtectsLeavesUsedTwice: a leaf used twice long ago outranks
// leaves used once more recently under TREESLRU (it is protected for eight
// passes of the cache), while TREELFU, which credits two hits with two
// passes only, evicts it first.
func TestSLRUProtectsLeavesUsedTwice(t *testing.T) {
	for _, tc := range []struct {
		name string
		want int
	}{{TREELFU, 0}, {TREESLRU, 2}} {
		p, err := New[int](tc.name)
		if err != nil {
			t.Fatal(err)
		}
		p.Admit(0)
		p.Access(0)
		p.Access(0)
		p.Admit(1) // a hot leaf that moves the clock four passes on
		for range 40 {
			p.Access(1)
		}
		for k := 2; k < 10; k++ {
			p.Admit(k)
		}
		for k := 2; k < 10; k++ {
			p.Access(k)
		}
		if got, ok := p.Evict(nil); !ok || got != tc.want {
			t.Errorf("%s evicts %d first, want %d", tc.name, got, tc.want)
		}
	}
}

// TestReturnProbLearns: TREERP's table follows what nodes of a class do —
// hit, evicted, or evicted and back — and depth separates classes.
func TestReturnProbLearns(t *testing.T) {
	var r returnProb
	r.init()
	shallow := tnode{depth: 1, hits: 1, hadChild: true}
	deep := tnode{depth: 20, hits: 1, hadChild: true}
	back := tnode{depth: 2, hits: 2, hadChild: true}
	for range 3 * rpPeriod / 4 {
		r.hit(&shallow)
		r.evicted(&deep)
		r.evicted(&back)
		r.returned(&ghost{depth: back.depth, hits: back.hits, hadChild: back.hadChild})
	}
	if p := r.p(shallow.depth, shallow.hits, true); p < 0.9 {
		t.Errorf("a class always hit returns with probability %.2f", p)
	}
	if p := r.p(deep.depth, deep.hits, true); p > 0.1 {
		t.Errorf("a class always evicted returns with probability %.2f", p)
	}
	if p := r.p(back.depth, back.hits, true); p < 0.9 {
		t.Errorf("a class whose evicted nodes always come back returns with probability %.2f", p)
	}
	if p := r.p(7, 0, false); p != float64(float32(0.02)) {
		t.Errorf("an unseen class has probability %.2f, want its prior 0.02", p)
	}
}
