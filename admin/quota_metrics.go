package admin

import (
	"github.com/prometheus/client_golang/prometheus"

	"kvtier/engine"
)

// Tenants' quotas (ram_bytes, disk_bytes): the limit, what is charged
// now, and the chunks evicted and refused to keep within it, per tenant
// and tier. Read from the tiers' counters at scrape time.
var (
	quotaLimitDesc     = prometheus.NewDesc("kvtier_tenant_quota_limit_bytes", "The tenant's quota in the tier (ram_bytes or disk_bytes).", []string{"tenant", "tier"}, nil)
	quotaUsedDesc      = prometheus.NewDesc("kvtier_tenant_quota_used_bytes", "Bytes of the tenant's chunks charged to its quota in the tier now.", []string{"tenant", "tier"}, nil)
	quotaEvictionsDesc = prometheus.NewDesc("kvtier_tenant_quota_evictions_total", "The tenant's chunks evicted from the tier to keep it within its quota.", []string{"tenant", "tier"}, nil)
	quotaRefusedDesc   = prometheus.NewDesc("kvtier_tenant_quota_refused_total", "The tenant's chunks refused by the tier because its quota was full of chunks in use.", []string{"tenant", "tier"}, nil)
)

func describeQuotas(ch chan<- *prometheus.Desc) {
	ch <- quotaLimitDesc
	ch <- quotaUsedDesc
	ch <- quotaEvictionsDesc
	ch <- quotaRefusedDesc
}

func collectQuotas(eng *engine.Engine, ch chan<- prometheus.Metric) {
	if eng == nil {
		return
	}
	for _, q := range eng.Quotas() {
		ch <- prometheus.MustNewConstMetric(quotaLimitDesc, prometheus.GaugeValue, float64(q.Limit), q.Owner, q.Tier)
		ch <- prometheus.MustNewConstMetric(quotaUsedDesc, prometheus.GaugeValue, float64(q.Used), q.Owner, q.Tier)
		ch <- prometheus.MustNewConstMetric(quotaEvictionsDesc, prometheus.CounterValue, float64(q.Evictions), q.Owner, q.Tier)
		ch <- prometheus.MustNewConstMetric(quotaRefusedDesc, prometheus.CounterValue, float64(q.Refused), q.Owner, q.Tier)
	}
}
