package engine

import (
	"kvtier/arena"
	"kvtier/tier"
	"kvtier/tier/disk"
	"kvtier/tier/p2p"
	"kvtier/tier/remote"
)

// Stats is a snapshot of every tier, the write queues of the tiers below
// RAM, and the RAM tier's arena. Its JSON form is the body of the admin
// API's GET /api/v1/stats and of the protocol's STATS reply.
type Stats struct {
	Tiers    []TierStats  `json:"tiers"`  // RAM first, then lower tiers fastest first
	Queues   []QueueStats `json:"queues"` // one per lower tier
	Promoted uint64       `json:"promoted"`
	Arena    ArenaStats   `json:"arena"`
	// ReadFailures counts lower-tier reads that failed (store down, timed
	// out, I/O error) and were served as misses.
	ReadFailures uint64 `json:"-"`
}

// TierStats is one tier's state and counters since start.
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
	// Remote is the breaker's counters of a remote tier, Disk the file
	// system state of the disk tier; nil for other tiers. Metrics read
	// them; the JSON snapshot leaves them out.
	Remote *RemoteHealth `json:"-"`
	Disk   *DiskSpace    `json:"-"`
	// Staging is a Redis tier's per-layer staging (on, or off after
	// Redis refused it); nil for tiers that do not stage.
	Staging *remote.StagingStatus `json:"-"`
	// Peers is the circuit state of each peer of the P2P tier, by
	// address ("closed", "open", "half-open"), and PeerHealth its
	// breaker's counters for metrics; nil for other tiers.
	Peers      map[string]string       `json:"peers,omitempty"`
	PeerHealth map[string]RemoteHealth `json:"-"`
}

// RemoteHealth is the circuit breaker's view of a remote tier.
type RemoteHealth struct {
	State     int // 0 closed (serving), 1 open (failing fast), 2 half-open (trying)
	Opens     uint64
	FastFails uint64
	Failures  uint64 // timeouts included
	Timeouts  uint64
	// Reads whose bytes failed verification, and the openings they
	// caused (counted in Opens too).
	Corrupt, CorruptOpens uint64
}

// DiskSpace is the disk tier's standing on its file system.
type DiskSpace struct {
	ReadOnly bool   // writes are refused until the file system has room
	NoSpace  uint64 // writes that failed because the file system was full
	Refused  uint64 // writes refused while read-only
}

// QueueStats is one lower tier's write queue.
type QueueStats struct {
	Tier     string `json:"tier"`
	Depth    int    `json:"depth"`
	Capacity int    `json:"capacity"`
	Dropped  uint64 `json:"dropped"`
	Failed   uint64 `json:"failed"`
	// Per-layer saves (docs/layerwise.md): records written by layer
	// ranges and committed, and the layer bytes given to them.
	LayerSaved uint64 `json:"layer_saved"`
	LayerBytes uint64 `json:"layer_bytes"`
}

// ArenaStats is the RAM tier's arena, and Leases the engine's leases
// that hold references in it (the arena has no leases of its own).
type ArenaStats struct {
	CapacityBytes    int64 `json:"capacity_bytes"`
	UsedBytes        int64 `json:"used_bytes"`
	PinnedBytes      int64 `json:"pinned_bytes"`
	Objects          int   `json:"objects"`
	Leases           int   `json:"leases"`
	FreeRuns         int   `json:"free_runs"`
	LargestFreeBytes int64 `json:"largest_free_bytes"`
}

// Stats takes a snapshot. Each tier is read on its own, so under load the
// figures of different tiers are not from one instant.
func (e *Engine) Stats() Stats {
	m := e.mgr
	tiers, queues := m.Stats()
	s := Stats{
		Tiers:        make([]TierStats, 0, len(tiers)),
		Queues:       make([]QueueStats, 0, len(queues)),
		Promoted:     m.Promoted(),
		ReadFailures: m.ReadFailed(),
		Arena:        arenaStats(e.arenaOf().Stats()),
	}
	s.Arena.Leases = e.leases.count()
	for i, t := range m.Tiers() {
		ts := tierStats(tiers[i])
		if g := remote.GuardOf(t); g != nil {
			h := g.Health()
			ts.Circuit = h.State.String()
			ts.Remote = remoteHealth(h)
			if r, ok := g.Inner().(remote.StagingReporter); ok {
				st := r.Staging()
				ts.Staging = &st
			}
		}
		if p, ok := t.(*p2p.Tier); ok {
			ts.Peers, ts.PeerHealth = map[string]string{}, map[string]RemoteHealth{}
			for addr, h := range p.Health() {
				ts.Peers[addr] = h.State.String()
				ts.PeerHealth[addr] = *remoteHealth(h)
			}
		}
		if d, ok := t.(*disk.Tier); ok {
			sp := d.Space()
			ts.Disk = &DiskSpace{ReadOnly: sp.ReadOnly, NoSpace: sp.NoSpace, Refused: sp.Refused}
		}
		s.Tiers = append(s.Tiers, ts)
	}
	for _, q := range queues {
		s.Queues = append(s.Queues, QueueStats(q))
	}
	return s
}

func remoteHealth(h remote.Health) *RemoteHealth {
	return &RemoteHealth{State: int(h.State), Opens: h.Opens, FastFails: h.FastFails,
		Failures: h.Failures, Timeouts: h.Timeouts, Corrupt: h.Corrupt, CorruptOpens: h.CorruptOpens}
}

func tierStats(t tier.Stats) TierStats {
	return TierStats{Name: t.Name, CapacityBytes: t.Capacity, UsedBytes: t.Used, Objects: t.Objects,
		PinnedBytes: t.Pinned, Hits: t.Hits, Misses: t.Misses, Puts: t.Puts, Evictions: t.Evictions,
		Removes: t.Removes, Corrupt: t.Corrupt, BytesRead: t.BytesRead, BytesWritten: t.BytesWritten}
}

func arenaStats(a arena.Stats) ArenaStats {
	return ArenaStats{CapacityBytes: a.Capacity, UsedBytes: a.Used, PinnedBytes: a.Pinned, Objects: a.Objects,
		FreeRuns: a.FreeRuns, LargestFreeBytes: a.LargestFree}
}
