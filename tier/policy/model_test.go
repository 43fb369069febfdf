package policy

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// model is a deliberately naive reference for the four policies whose
// choice is a plain function of each key's history: it scans every entry.
type model struct {
	name    string
	entries []modelEntry
	clock   int
}

type modelEntry struct {
	key   int
	refs  int // admissions plus hits
	added int // clock at admission
	used  int // clock at the last admission or hit
}

func (m *model) find(k int) int {
	return slices.IndexFunc(m.entries, func(e modelEntry) bool { return e.key == k })
}

func (m *model) admit(k int) {
	if m.find(k) >= 0 {
		m.access(k)
		return
	}
	m.clock++
	m.entries = append(m.entries, modelEntry{key: k, refs: 1, added: m.clock, used: m.clock})
}

func (m *model) access(k int) {
	if i := m.find(k); i >= 0 {
		m.clock++
		m.entries[i].refs++
		m.entries[i].used = m.clock
	}
}

func (m *model) remove(k int) {
	if i := m.find(k); i >= 0 {
		m.entries = slices.Delete(m.entries, i, i+1)
	}
}

// before reports whether a should be evicted before b.
func (m *model) before(a, b modelEntry) bool {
	switch m.name {
	case LRU:
		return a.used < b.used
	case MRU:
		return a.used > b.used
	case FIFO:
		return a.added < b.added
	case LFU:
		return a.refs < b.refs || a.refs == b.refs && a.used < b.used
	}
	panic("no model for " + m.name)
}

func (m *model) evict(busy func(int) bool) (int, bool) {
	best := -1
	for i, e := range m.entries {
		if !busy(e.key) && (best < 0 || m.before(e, m.entries[best])) {
			best = i
		}
	}
	if best < 0 {
		return 0, false
	}
	k := m.entries[best].key
	m.entries = slices.Delete(m.entries, best, best+1)
	return k, true
}

// run interprets ops as a program against every policy and checks each
// against its model (when it has one) and against invariants every policy
// must keep: Evict returns a tracked idle key, fails only when every
// tracked key is busy, and Len counts the tracked keys.
func run(t *testing.T, ops []byte) {
	for _, name := range Names() {
		p, _ := New[int](name)
		var ref *model
		if name == LRU || name == LFU || name == FIFO || name == MRU {
			ref = &model{name: name}
		}
		resident := map[int]bool{}
		for j := 0; j+1 < len(ops); j += 2 {
			op, arg := ops[j]%8, int(ops[j+1])
			k := arg % 24
			switch op {
			case 0, 1, 2: // admissions dominate so the policies fill up
				p.Admit(k)
				resident[k] = true
				if ref != nil {
					ref.admit(k)
				}
			case 3, 4:
				p.Access(k)
				if ref != nil {
					ref.access(k)
				}
			case 5:
				p.Remove(k)
				delete(resident, k)
				if ref != nil {
					ref.remove(k)
				}
			default: // evict; arg's bits say which keys (mod 8) are busy
				busy := func(k int) bool { return arg>>(k%8)&1 == 1 }
				got, ok := p.Evict(busy)
				anyIdle := false
				for r := range resident {
					anyIdle = anyIdle || !busy(r)
				}
				switch {
				case ok != anyIdle:
					t.Fatalf("%s op %d: Evict ok = %v with idle keys present = %v", name, j/2, ok, anyIdle)
				case ok && !resident[got]:
					t.Fatalf("%s op %d: evicted untracked key %d", name, j/2, got)
				case ok && busy(got):
					t.Fatalf("%s op %d: evicted busy key %d", name, j/2, got)
				}
				if ok {
					delete(resident, got)
				}
				if ref != nil {
					want, wok := ref.evict(busy)
					if ok != wok || got != want {
						t.Fatalf("%s op %d: Evict = %d, %v; model says %d, %v", name, j/2, got, ok, want, wok)
					}
				}
			}
			if p.Len() != len(resident) {
				t.Fatalf("%s op %d: Len = %d, want %d", name, j/2, p.Len(), len(resident))
			}
		}
	}
}

func TestAgainstModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		ops := make([]byte, 2*(50+r.IntN(500)))
		for i := range ops {
			ops[i] = byte(r.UintN(256))
		}
		run(t, ops)
	}
}

func FuzzPolicies(f *testing.F) {
	f.Add([]byte{0, 1, 0, 2, 0, 3, 3, 1, 7, 0, 7, 1, 5, 2, 7, 255})
	f.Add([]byte{0, 1, 0, 2, 6, 0, 0, 1, 6, 0, 0, 1, 6, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 4096 {
			ops = ops[:4096]
		}
		run(t, ops)
	})
}
