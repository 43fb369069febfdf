package admin

import (
	"github.com/prometheus/client_golang/prometheus"

	"kvtier/chunk"
	"kvtier/engine"
	"kvtier/tenant"
)

// tenantCollector exports per-tenant metrics at scrape time: the chunks
// and bytes each tenant's registered scopes hold in the tiers that can
// list their chunks, and the requests refused for reaching beyond the
// tenant's namespaces. A scrape walks the listable tiers' indexes once,
// as GET /api/v1/scopes does; nothing is counted on the data path but
// the refusals.
type tenantCollector struct {
	eng     *engine.Engine
	tenants *tenant.Set
}

var (
	tenantChunksDesc  = prometheus.NewDesc("kvtier_tenant_chunks", "Chunks of the tenant's registered scopes the tier holds now.", []string{"tenant", "tier"}, nil)
	tenantBytesDesc   = prometheus.NewDesc("kvtier_tenant_bytes", "Bytes of the tenant's registered scopes the tier holds now.", []string{"tenant", "tier"}, nil)
	tenantRefusedDesc = prometheus.NewDesc("kvtier_tenant_refused_total", "Requests presenting the tenant's token refused for reaching beyond its namespaces.", []string{"tenant"}, nil)
)

func newTenantCollector(eng *engine.Engine, ts *tenant.Set) *tenantCollector {
	return &tenantCollector{eng: eng, tenants: ts}
}

func (c *tenantCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- tenantChunksDesc
	ch <- tenantBytesDesc
	ch <- tenantRefusedDesc
	describeQuotas(ch)
}

type tierUse struct{ chunks, bytes int }

func (c *tenantCollector) Collect(ch chan<- prometheus.Metric) {
	collectQuotas(c.eng, ch)
	all := c.tenants.All()
	for _, t := range all {
		ch <- prometheus.MustNewConstMetric(tenantRefusedDesc, prometheus.CounterValue, float64(t.Refused.Load()), t.Name)
	}
	// Sum by scope under the tiers' locks, then name the scopes' tenants
	// outside them (ListChunks' callback may not call into the engine).
	type at struct {
		scope uint64
		tier  string
	}
	byScope := map[at]tierUse{}
	c.eng.ListChunks([]uint64{0}, func(name string, k chunk.Key, size int) bool {
		u := byScope[at{k.Scope, name}]
		u.chunks++
		u.bytes += size
		byScope[at{k.Scope, name}] = u
		return true
	})
	owner := map[uint64]*tenant.Tenant{}
	sums := map[*tenant.Tenant]map[string]tierUse{}
	for _, t := range all {
		sums[t] = map[string]tierUse{}
		for _, name := range c.eng.TierNames() {
			sums[t][name] = tierUse{} // a tenant with nothing reads 0, not absent
		}
	}
	for k, u := range byScope {
		t, seen := owner[k.scope]
		if !seen {
			if s, ok := c.eng.Scope(k.scope); ok {
				t = ownerOf(all, s)
			}
			owner[k.scope] = t
		}
		if t == nil {
			continue
		}
		sum := sums[t][k.tier]
		sum.chunks += u.chunks
		sum.bytes += u.bytes
		sums[t][k.tier] = sum
	}
	for _, t := range all {
		for tier, u := range sums[t] {
			ch <- prometheus.MustNewConstMetric(tenantChunksDesc, prometheus.GaugeValue, float64(u.chunks), t.Name, tier)
			ch <- prometheus.MustNewConstMetric(tenantBytesDesc, prometheus.GaugeValue, float64(u.bytes), t.Name, tier)
		}
	}
}

// ownerOf returns the tenant whose namespaces hold s, or nil (namespaces
// of two tenants never overlap: config validation refuses it).
func ownerOf(all []*tenant.Tenant, s chunk.Scope) *tenant.Tenant {
	for _, t := range all {
		if t.AllowsScope(s) {
			return t
		}
	}
	return nil
}
