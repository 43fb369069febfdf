package server

import (
	"kvtier/arena"
	"kvtier/tier"
	"kvtier/tier/remote"
)

// Stats is the body of GET /api/v1/stats: a snapshot of every tier, the
// write queues of the tiers below RAM, and the RAM tier's arena.
type Stats struct {
	Tiers    []TierStats  `json:"tiers"`  // RAM first, then lower tiers fastest first
	Queues   []QueueStats `json:"queues"` // one per lower tier
	Promoted uint64       `json:"promoted"`
	Arena    ArenaStats   `json:"arena"`
}

// TierStats is tier.Stats with JSON names.
type TierStats struct {
	Name          string `json:"name"`
	CapacityBytes int64  `json:"capacity_bytes"`
	UsedBytes     int64  `json:"used_bytes"`
	Objects       int64  `json:"objects"`
	PinnedBytes   int64  `json:"pinned_bytes"`
	Hits          uint64 `json:"hits"`
	Misses        uint64 `json:"misses"`
	Puts          uint64 `json:"puts"`
	Evictions     uint64 `json:"evictions"`
	Removes       uint64 `json:"removes"`
	Corrupt       uint64 `json:"corrupt"`
	BytesRead     uint64 `json:"bytes_read"`
	BytesWritten  uint64 `json:"bytes_written"`
	// Circuit is the circuit breaker's state of a remote tier (closed,
	// open, half-open); empty for local tiers.
	Circuit string `json:"circuit,omitempty"`
}

// QueueStats is tier.QueueStats with JSON names.
type QueueStats struct {
	Tier     string `json:"tier"`
	Depth    int    `json:"depth"`
	Capacity int    `json:"capacity"`
	Dropped  uint64 `json:"dropped"`
	Failed   uint64 `json:"failed"`
}

// ArenaStats is arena.Stats with JSON names.
type ArenaStats struct {
	CapacityBytes    int64 `json:"capacity_bytes"`
	UsedBytes        int64 `json:"used_bytes"`
	PinnedBytes      int64 `json:"pinned_bytes"`
	Objects          int   `json:"objects"`
	Leases           int   `json:"leases"`
	FreeRuns         int   `json:"free_runs"`
	LargestFreeBytes int64 `json:"largest_free_bytes"`
}

// ReadStats takes a snapshot of m. Each tier is read on its own, so under
// load the figures of different tiers are not from one instant.
func ReadStats(m *tier.Manager) Stats {
	tiers, queues := m.Stats()
	s := Stats{
		Tiers:    make([]TierStats, 0, len(tiers)),
		Queues:   make([]QueueStats, 0, len(queues)),
		Promoted: m.Promoted(),
		Arena:    arenaStats(m.RAM().Arena().Stats()),
	}
	for i, t := range m.Tiers() {
		ts := tierStats(tiers[i])
		if g := remote.GuardOf(t); g != nil {
			ts.Circuit = g.Health().State.String()
		}
		s.Tiers = append(s.Tiers, ts)
	}
	for _, q := range queues {
		s.Queues = append(s.Queues, QueueStats(q))
	}
	return s
}

func tierStats(t tier.Stats) TierStats {
	return TierStats{Name: t.Name, CapacityBytes: t.Capacity, UsedBytes: t.Used, Objects: t.Objects,
		PinnedBytes: t.Pinned, Hits: t.Hits, Misses: t.Misses, Puts: t.Puts, Evictions: t.Evictions,
		Removes: t.Removes, Corrupt: t.Corrupt, BytesRead: t.BytesRead, BytesWritten: t.BytesWritten}
}

func arenaStats(a arena.Stats) ArenaStats {
	return ArenaStats{CapacityBytes: a.Capacity, UsedBytes: a.Used, PinnedBytes: a.Pinned, Objects: a.Objects,
		Leases: a.Leases, FreeRuns: a.FreeRuns, LargestFreeBytes: a.LargestFree}
}
