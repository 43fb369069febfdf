package kvevents

import "testing"

func TestSequencer(t *testing.T) {
	type step struct {
		seq      uint64
		st       Status
		missing  bool
		from, to uint64
	}
	cases := map[string][]step{
		"in order from zero":     {{0, First, false, 0, 0}, {1, InOrder, false, 0, 0}, {2, InOrder, false, 0, 0}},
		"late join then gap":     {{100, First, false, 0, 0}, {101, InOrder, false, 0, 0}, {105, Gap, true, 102, 104}, {106, InOrder, false, 0, 0}},
		"gap of one":             {{5, First, false, 0, 0}, {7, Gap, true, 6, 6}},
		"restart at zero":        {{50, First, false, 0, 0}, {51, InOrder, false, 0, 0}, {0, Restart, false, 0, 0}, {1, InOrder, false, 0, 0}},
		"restart, first lost":    {{50, First, false, 0, 0}, {3, Restart, true, 0, 2}, {4, InOrder, false, 0, 0}},
		"duplicate is a restart": {{7, First, false, 0, 0}, {7, Restart, true, 0, 6}},
	}
	for name, steps := range cases {
		var s Sequencer
		if _, ok := s.Next(); ok {
			t.Fatalf("%s: fresh sequencer claims a baseline", name)
		}
		for i, want := range steps {
			st, missing, from, to := s.Observe(want.seq)
			if st != want.st || missing != want.missing || from != want.from || to != want.to {
				t.Errorf("%s step %d: Observe(%d) = %v, %v, %d, %d; want %v, %v, %d, %d",
					name, i, want.seq, st, missing, from, to, want.st, want.missing, want.from, want.to)
			}
			if next, ok := s.Next(); !ok || next != want.seq+1 {
				t.Errorf("%s step %d: Next = %d, %v", name, i, next, ok)
			}
		}
	}
}
