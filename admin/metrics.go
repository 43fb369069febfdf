package admin

import (
	"github.com/prometheus/client_golang/prometheus"

	"kvtier/engine"
	"kvtier/tier/remote"
)

// metric is one kvtier metric family and how to read its value from a
// snapshot of type S.
type metric[S any] struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(S) float64
}

func newMetric[S any](name, help string, kind prometheus.ValueType, value func(S) float64, labels ...string) metric[S] {
	return metric[S]{desc: prometheus.NewDesc("kvtier_"+name, help, labels, nil), kind: kind, value: value}
}

const (
	gauge   = prometheus.GaugeValue
	counter = prometheus.CounterValue
)

// The tables below are the whole metric set; docs/metrics.md lists the
// same names and a test keeps the two in step.
var (
	tierMetrics = []metric[engine.TierStats]{
		newMetric("tier_capacity_bytes", "Bytes the tier may hold.", gauge, func(s engine.TierStats) float64 { return float64(s.CapacityBytes) }, "tier"),
		newMetric("tier_used_bytes", "Bytes the tier holds now.", gauge, func(s engine.TierStats) float64 { return float64(s.UsedBytes) }, "tier"),
		newMetric("tier_objects", "Chunks the tier holds now.", gauge, func(s engine.TierStats) float64 { return float64(s.Objects) }, "tier"),
		newMetric("tier_pinned_bytes", "Bytes pinned or leased now, which eviction may not take.", gauge, func(s engine.TierStats) float64 { return float64(s.PinnedBytes) }, "tier"),
		newMetric("tier_hits_total", "Reads the tier served.", counter, func(s engine.TierStats) float64 { return float64(s.Hits) }, "tier"),
		newMetric("tier_misses_total", "Reads of chunks the tier did not hold.", counter, func(s engine.TierStats) float64 { return float64(s.Misses) }, "tier"),
		newMetric("tier_puts_total", "Chunks written into the tier.", counter, func(s engine.TierStats) float64 { return float64(s.Puts) }, "tier"),
		newMetric("tier_evictions_total", "Chunks the tier evicted to make room.", counter, func(s engine.TierStats) float64 { return float64(s.Evictions) }, "tier"),
		newMetric("tier_removes_total", "Chunks removed on request (remove, clear).", counter, func(s engine.TierStats) float64 { return float64(s.Removes) }, "tier"),
		newMetric("tier_corrupt_total", "Chunks dropped because they failed validation.", counter, func(s engine.TierStats) float64 { return float64(s.Corrupt) }, "tier"),
		newMetric("tier_read_bytes_total", "Bytes read from the tier.", counter, func(s engine.TierStats) float64 { return float64(s.BytesRead) }, "tier"),
		newMetric("tier_written_bytes_total", "Bytes written to the tier.", counter, func(s engine.TierStats) float64 { return float64(s.BytesWritten) }, "tier"),
	}
	queueMetrics = []metric[engine.QueueStats]{
		newMetric("write_queue_depth", "Writes waiting in the tier's queue now.", gauge, func(q engine.QueueStats) float64 { return float64(q.Depth) }, "tier"),
		newMetric("write_queue_capacity", "Writes the tier's queue can hold (write_queue_depth).", gauge, func(q engine.QueueStats) float64 { return float64(q.Capacity) }, "tier"),
		newMetric("write_queue_dropped_total", "Writes dropped because the tier's queue stayed full for write_wait.", counter, func(q engine.QueueStats) float64 { return float64(q.Dropped) }, "tier"),
		newMetric("write_queue_failed_total", "Writes the tier refused.", counter, func(q engine.QueueStats) float64 { return float64(q.Failed) }, "tier"),
		newMetric("layer_saved_total", "Records a per-layer save wrote by layer ranges and committed.", counter, func(q engine.QueueStats) float64 { return float64(q.LayerSaved) }, "tier"),
		newMetric("layer_saved_bytes_total", "Layer bytes per-layer saves gave to range writes before their commit.", counter, func(q engine.QueueStats) float64 { return float64(q.LayerBytes) }, "tier"),
	}
	arenaMetrics = []metric[engine.ArenaStats]{
		newMetric("arena_capacity_bytes", "Bytes mapped for the RAM tier's arena.", gauge, func(a engine.ArenaStats) float64 { return float64(a.CapacityBytes) }),
		newMetric("arena_used_bytes", "Arena bytes allocated, in whole pages.", gauge, func(a engine.ArenaStats) float64 { return float64(a.UsedBytes) }),
		newMetric("arena_pinned_bytes", "Arena bytes of objects referenced by more than the RAM tier (held by leases or being read).", gauge, func(a engine.ArenaStats) float64 { return float64(a.PinnedBytes) }),
		newMetric("arena_objects", "Live arena objects, including ones not yet committed.", gauge, func(a engine.ArenaStats) float64 { return float64(a.Objects) }),
		newMetric("arena_leases", "Engine leases holding arena memory for cache protocol clients.", gauge, func(a engine.ArenaStats) float64 { return float64(a.Leases) }),
		newMetric("arena_free_runs", "Runs the arena's free space is split into (fragmentation).", gauge, func(a engine.ArenaStats) float64 { return float64(a.FreeRuns) }),
		newMetric("arena_largest_free_bytes", "Longest free run of the arena.", gauge, func(a engine.ArenaStats) float64 { return float64(a.LargestFreeBytes) }),
	}
	remoteMetrics = []metric[engine.RemoteHealth]{
		newMetric("remote_circuit_state", "Circuit breaker of the remote tier: 0 closed (serving), 1 open (failing fast), 2 half-open (trying).", gauge, func(h engine.RemoteHealth) float64 { return float64(h.State) }, "tier"),
		newMetric("remote_circuit_opens_total", "Times the remote tier's circuit opened.", counter, func(h engine.RemoteHealth) float64 { return float64(h.Opens) }, "tier"),
		newMetric("remote_fast_fails_total", "Calls refused at once because the circuit was open.", counter, func(h engine.RemoteHealth) float64 { return float64(h.FastFails) }, "tier"),
		newMetric("remote_failures_total", "Calls to the remote store that failed, timeouts included.", counter, func(h engine.RemoteHealth) float64 { return float64(h.Failures) }, "tier"),
		newMetric("remote_timeouts_total", "Calls to the remote store that missed their deadline (remote_timeout plus the object's bytes at the tier's bandwidth).", counter, func(h engine.RemoteHealth) float64 { return float64(h.Timeouts) }, "tier"),
		newMetric("remote_corrupt_reads_total", "Reads from the remote store whose bytes failed verification (checksum), counted apart from failures.", counter, func(h engine.RemoteHealth) float64 { return float64(h.Corrupt) }, "tier"),
		newMetric("remote_circuit_corrupt_opens_total", "Times the remote tier's circuit opened because its reads failed verification.", counter, func(h engine.RemoteHealth) float64 { return float64(h.CorruptOpens) }, "tier"),
	}
	stagingMetrics = []metric[remote.StagingStatus]{
		newMetric("remote_staging", "1 while per-layer saves stage into the Redis tier, 0 while they write whole chunks (configured so, or Redis refused staging and no retry has succeeded yet).", gauge, func(s remote.StagingStatus) float64 { return bool01(s.On) }, "tier"),
		newMetric("remote_staging_offs_total", "Times a refusal from Redis turned staging off for the tier.", counter, func(s remote.StagingStatus) float64 { return float64(s.Offs) }, "tier"),
	}
	peerMetrics = []metric[engine.RemoteHealth]{
		newMetric("p2p_peer_circuit_state", "Circuit breaker of a peer of the P2P tier: 0 closed (serving), 1 open (failing fast), 2 half-open (trying).", gauge, func(h engine.RemoteHealth) float64 { return float64(h.State) }, "peer"),
		newMetric("p2p_peer_circuit_opens_total", "Times the peer's circuit opened.", counter, func(h engine.RemoteHealth) float64 { return float64(h.Opens) }, "peer"),
		newMetric("p2p_peer_fast_fails_total", "Calls to the peer refused at once because its circuit was open.", counter, func(h engine.RemoteHealth) float64 { return float64(h.FastFails) }, "peer"),
		newMetric("p2p_peer_failures_total", "Calls to the peer that failed, timeouts included.", counter, func(h engine.RemoteHealth) float64 { return float64(h.Failures) }, "peer"),
		newMetric("p2p_peer_timeouts_total", "Calls to the peer that missed their deadline (remote_timeout plus the chunk's bytes at 128 MiB/s).", counter, func(h engine.RemoteHealth) float64 { return float64(h.Timeouts) }, "peer"),
		newMetric("p2p_peer_corrupt_reads_total", "Reads from the peer whose bytes failed their checksum, counted apart from failures.", counter, func(h engine.RemoteHealth) float64 { return float64(h.Corrupt) }, "peer"),
		newMetric("p2p_peer_circuit_corrupt_opens_total", "Times the peer's circuit opened because its reads failed their checksum.", counter, func(h engine.RemoteHealth) float64 { return float64(h.CorruptOpens) }, "peer"),
	}
	diskMetrics = []metric[engine.DiskSpace]{
		newMetric("disk_read_only", "1 while the disk tier refuses writes because its file system is full for other reasons, else 0.", gauge, func(s engine.DiskSpace) float64 { return bool01(s.ReadOnly) }, "tier"),
		newMetric("disk_no_space_total", "Disk tier writes that failed because the file system was full.", counter, func(s engine.DiskSpace) float64 { return float64(s.NoSpace) }, "tier"),
		newMetric("disk_refused_total", "Writes the disk tier refused while read-only.", counter, func(s engine.DiskSpace) float64 { return float64(s.Refused) }, "tier"),
	}
	promotedDesc = prometheus.NewDesc("kvtier_promoted_total", "Chunks promoted from lower tiers into RAM.", nil, nil)
	readFailDesc = prometheus.NewDesc("kvtier_read_failures_total", "Reads from tiers below RAM that failed (store down, timed out, I/O error) and were served as misses.", nil, nil)
)

// collector reads the engine's counters when Prometheus scrapes, so the
// cache's own paths do no metric work at all.
type collector struct {
	eng *engine.Engine
}

func newCollector(e *engine.Engine) collector { return collector{eng: e} }

// Describe implements prometheus.Collector.
func (c collector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, tierMetrics)
	describe(ch, queueMetrics)
	describe(ch, arenaMetrics)
	describe(ch, remoteMetrics)
	describe(ch, stagingMetrics)
	describe(ch, peerMetrics)
	describe(ch, diskMetrics)
	ch <- promotedDesc
	ch <- readFailDesc
}

// Collect implements prometheus.Collector.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	st := c.eng.Stats()
	for _, s := range st.Tiers {
		collect(ch, tierMetrics, s, s.Name)
	}
	for _, q := range st.Queues {
		collect(ch, queueMetrics, q, q.Tier)
	}
	collect(ch, arenaMetrics, st.Arena)
	for _, s := range st.Tiers {
		if s.Remote != nil {
			collect(ch, remoteMetrics, *s.Remote, s.Name)
		}
		if s.Staging != nil {
			collect(ch, stagingMetrics, *s.Staging, s.Name)
		}
		if s.Disk != nil {
			collect(ch, diskMetrics, *s.Disk, s.Name)
		}
		for addr, h := range s.PeerHealth {
			collect(ch, peerMetrics, h, addr)
		}
	}
	ch <- prometheus.MustNewConstMetric(promotedDesc, counter, float64(st.Promoted))
	ch <- prometheus.MustNewConstMetric(readFailDesc, counter, float64(st.ReadFailures))
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func describe[S any](ch chan<- *prometheus.Desc, ms []metric[S]) {
	for _, m := range ms {
		ch <- m.desc
	}
}

// collect sends one sample per metric of ms, labelled with labels.
func collect[S any](ch chan<- prometheus.Metric, ms []metric[S], s S, labels ...string) {
	for _, m := range ms {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(s), labels...)
	}
}
