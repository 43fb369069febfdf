package scale

import (
	"runtime"
	"time"

	"kvtier/tier/policy"
)

// ChurnRow is the cost of storing a chunk into a full RAM tier, which
// evicts one for each, against storing it into one with room to spare.
type ChurnRow struct {
	Policy string
	Chunks int           // chunks the full tier holds
	Churn  time.Duration // per chunk stored into the full tier: insert + one eviction
	Room   time.Duration // per chunk stored with room: insert only
}

// Evict returns the eviction's share: Churn - Room.
func (r ChurnRow) Evict() time.Duration { return r.Churn - r.Room }

// Churn measures, for every eviction policy and tier size, storing n/2
// fresh chunks into a full tier of n chunks, and the same into a tier of
// 2n chunks holding n (the baseline: the same inserts without evicting).
func Churn(counts []int, rounds int) ([]ChurnRow, error) {
	var rows []ChurnRow
	for _, name := range policy.Names() {
		for _, n := range counts {
			row := ChurnRow{Policy: name, Chunks: n}
			var err error
			if row.Churn, err = churnTime(name, n, n, rounds); err != nil {
				return rows, err
			}
			if row.Room, err = churnTime(name, 2*n, n, rounds); err != nil {
				return rows, err
			}
			rows = append(rows, row)
		}
	}
	return rows, nil
}

// churnTime fills a tier of capacity pages with n chunks and returns the
// best over rounds of the mean CPU time to store n/2 more (a fresh tier each
// round).
func churnTime(name string, capacity, n, rounds int) (time.Duration, error) {
	best := time.Duration(1 << 62)
	m := max(n/2, 1)
	for range rounds {
		t, a, err := newRAM(capacity, name)
		if err != nil {
			return 0, err
		}
		if err := insert(t, a, 0, n); err != nil {
			a.Close()
			return 0, err
		}
		runtime.LockOSThread()
		start := threadCPU()
		err = insert(t, a, n, n+m)
		d := (threadCPU() - start) / time.Duration(m)
		runtime.UnlockOSThread()
		a.Close()
		if err != nil {
			return 0, err
		}
		best = min(best, d)
	}
	return best, nil
}
