package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"kvtier/arena"
	"kvtier/tier"
	"kvtier/tier/disk"
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
	tierMetrics = []metric[tier.Stats]{
		newMetric("tier_capacity_bytes", "Bytes the tier may hold.", gauge, func(s tier.Stats) float64 { return float64(s.Capacity) }, "tier"),
		newMetric("tier_used_bytes", "Bytes the tier holds now.", gauge, func(s tier.Stats) float64 { return float64(s.Used) }, "tier"),
		newMetric("tier_objects", "Chunks the tier holds now.", gauge, func(s tier.Stats) float64 { return float64(s.Objects) }, "tier"),
		newMetric("tier_pinned_bytes", "Bytes pinned or leased now, which eviction may not take.", gauge, func(s tier.Stats) float64 { return float64(s.Pinned) }, "tier"),
		newMetric("tier_hits_total", "Reads the tier served.", counter, func(s tier.Stats) float64 { return float64(s.Hits) }, "tier"),
		newMetric("tier_misses_total", "Reads of chunks the tier did not hold.", counter, func(s tier.Stats) float64 { return float64(s.Misses) }, "tier"),
		newMetric("tier_puts_total", "Chunks written into the tier.", counter, func(s tier.Stats) float64 { return float64(s.Puts) }, "tier"),
		newMetric("tier_evictions_total", "Chunks the tier evicted to make room.", counter, func(s tier.Stats) float64 { return float64(s.Evictions) }, "tier"),
		newMetric("tier_removes_total", "Chunks removed on request (remove, clear).", counter, func(s tier.Stats) float64 { return float64(s.Removes) }, "tier"),
		newMetric("tier_corrupt_total", "Chunks dropped because they failed validation.", counter, func(s tier.Stats) float64 { return float64(s.Corrupt) }, "tier"),
		newMetric("tier_read_bytes_total", "Bytes read from the tier.", counter, func(s tier.Stats) float64 { return float64(s.BytesRead) }, "tier"),
		newMetric("tier_written_bytes_total", "Bytes written to the tier.", counter, func(s tier.Stats) float64 { return float64(s.BytesWritten) }, "tier"),
	}
	queueMetrics = []metric[tier.QueueStats]{
		newMetric("write_queue_depth", "Writes waiting in the tier's queue now.", gauge, func(q tier.QueueStats) float64 { return float64(q.Depth) }, "tier"),
		newMetric("write_queue_capacity", "Writes the tier's queue can hold (write_queue_depth).", gauge, func(q tier.QueueStats) float64 { return float64(q.Capacity) }, "tier"),
		newMetric("write_queue_dropped_total", "Writes dropped because the tier's queue stayed full for write_wait.", counter, func(q tier.QueueStats) float64 { return float64(q.Dropped) }, "tier"),
		newMetric("write_queue_failed_total", "Writes the tier refused.", counter, func(q tier.QueueStats) float64 { return float64(q.Failed) }, "tier"),
	}
	arenaMetrics = []metric[arena.Stats]{
		newMetric("arena_capacity_bytes", "Bytes mapped for the RAM tier's arena.", gauge, func(a arena.Stats) float64 { return float64(a.Capacity) }),
		newMetric("arena_used_bytes", "Arena bytes allocated, in whole pages.", gauge, func(a arena.Stats) float64 { return float64(a.Used) }),
		newMetric("arena_pinned_bytes", "Arena bytes of leased or multiply referenced objects.", gauge, func(a arena.Stats) float64 { return float64(a.Pinned) }),
		newMetric("arena_objects", "Live arena objects, including ones not yet committed.", gauge, func(a arena.Stats) float64 { return float64(a.Objects) }),
		newMetric("arena_leases", "Leases holding arena memory: cache protocol clients' and the RAM tier's pins.", gauge, func(a arena.Stats) float64 { return float64(a.Leases) }),
		newMetric("arena_free_runs", "Runs the arena's free space is split into (fragmentation).", gauge, func(a arena.Stats) float64 { return float64(a.FreeRuns) }),
		newMetric("arena_largest_free_bytes", "Longest free run of the arena.", gauge, func(a arena.Stats) float64 { return float64(a.LargestFree) }),
	}
	remoteMetrics = []metric[remote.Health]{
		newMetric("remote_circuit_state", "Circuit breaker of the remote tier: 0 closed (serving), 1 open (failing fast), 2 half-open (trying).", gauge, func(h remote.Health) float64 { return float64(h.State) }, "tier"),
		newMetric("remote_circuit_opens_total", "Times the remote tier's circuit opened.", counter, func(h remote.Health) float64 { return float64(h.Opens) }, "tier"),
		newMetric("remote_fast_fails_total", "Calls refused at once because the circuit was open.", counter, func(h remote.Health) float64 { return float64(h.FastFails) }, "tier"),
		newMetric("remote_failures_total", "Calls to the remote store that failed, timeouts included.", counter, func(h remote.Health) float64 { return float64(h.Failures) }, "tier"),
		newMetric("remote_timeouts_total", "Calls to the remote store that missed their deadline (remote_timeout plus the object's bytes at the tier's bandwidth).", counter, func(h remote.Health) float64 { return float64(h.Timeouts) }, "tier"),
	}
	diskMetrics = []metric[disk.Space]{
		newMetric("disk_read_only", "1 while the disk tier refuses writes because its file system is full for other reasons, else 0.", gauge, func(s disk.Space) float64 { return bool01(s.ReadOnly) }, "tier"),
		newMetric("disk_no_space_total", "Disk tier writes that failed because the file system was full.", counter, func(s disk.Space) float64 { return float64(s.NoSpace) }, "tier"),
		newMetric("disk_refused_total", "Writes the disk tier refused while read-only.", counter, func(s disk.Space) float64 { return float64(s.Refused) }, "tier"),
	}
	promotedDesc = prometheus.NewDesc("kvtier_promoted_total", "Chunks promoted from lower tiers into RAM.", nil, nil)
	readFailDesc = prometheus.NewDesc("kvtier_read_failures_total", "Reads from tiers below RAM that failed (store down, timed out, I/O error) and were served as misses.", nil, nil)
)

// collector reads the manager's counters when Prometheus scrapes, so the
// cache's own paths do no metric work at all. leases, when set, counts the
// leases the cache protocol holds: they pin arena objects by reference,
// not by the arena's own leases, so the arena alone would report none.
type collector struct {
	mgr    *tier.Manager
	leases func() int64
}

func newCollector(m *tier.Manager) collector { return collector{mgr: m} }

// Describe implements prometheus.Collector.
func (c collector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, tierMetrics)
	describe(ch, queueMetrics)
	describe(ch, arenaMetrics)
	describe(ch, remoteMetrics)
	describe(ch, diskMetrics)
	ch <- promotedDesc
	ch <- readFailDesc
}

// Collect implements prometheus.Collector.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	tiers, queues := c.mgr.Stats()
	for _, s := range tiers {
		collect(ch, tierMetrics, s, s.Name)
	}
	for _, q := range queues {
		collect(ch, queueMetrics, q, q.Tier)
	}
	as := c.mgr.RAM().Arena().Stats()
	if c.leases != nil {
		as.Leases += int(c.leases())
	}
	collect(ch, arenaMetrics, as)
	for _, t := range c.mgr.Tiers() {
		if g := remote.GuardOf(t); g != nil {
			collect(ch, remoteMetrics, g.Health(), t.Name())
		}
		if d, ok := t.(*disk.Tier); ok {
			collect(ch, diskMetrics, d.Space(), t.Name())
		}
	}
	ch <- prometheus.MustNewConstMetric(promotedDesc, counter, float64(c.mgr.Promoted()))
	ch <- prometheus.MustNewConstMetric(readFailDesc, counter, float64(c.mgr.ReadFailed()))
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
