package engine

import (
	"kvtier/chunk"
	"kvtier/config"
	"kvtier/tier"
)

// QuotaOwner is an owner of namespaces with byte quotas in the RAM and
// disk tiers (a tenant with ram_bytes or disk_bytes, docs/security.md).
// A zero quota is none.
type QuotaOwner struct {
	Name       string
	Namespaces []string // as config.NamespaceMatches reads them
	RAMBytes   int64
	DiskBytes  int64
}

// QuotaStats is one owner's account in one tier.
type QuotaStats struct {
	Tier string
	tier.QuotaStats
}

// quotas holds the accounts the engine gave its RAM and disk tiers, and
// which owner each namespace entry names.
type quotas struct {
	owners []QuotaOwner
	tiers  []quotaTier
}

type quotaTier struct {
	name string
	q    *tier.Quota
	t    tier.Tier
}

// QuotaOwnersFromConfig returns the tenants that have a quota.
func QuotaOwnersFromConfig(c config.Config) []QuotaOwner {
	var out []QuotaOwner
	for _, t := range c.Tenants {
		if t.RAMBytes > 0 || t.DiskBytes > 0 {
			out = append(out, QuotaOwner{Name: t.Name, Namespaces: t.Namespaces,
				RAMBytes: int64(t.RAMBytes), DiskBytes: int64(t.DiskBytes)})
		}
	}
	return out
}

// setQuotas gives the RAM tier and the disk tier, when there is one, an
// account per owner with a quota there.
func (e *Engine) setQuotas(owners []QuotaOwner) {
	if len(owners) == 0 {
		return
	}
	e.quotas = &quotas{owners: owners}
	for i, t := range e.mgr.Tiers() {
		qs, ok := t.(tier.QuotaSetter)
		if !ok || i > 0 && t.Name() != "disk" {
			continue
		}
		var names []string
		var limits []int64
		for _, o := range owners {
			limit := o.RAMBytes
			if i > 0 {
				limit = o.DiskBytes
			}
			if limit > 0 {
				names, limits = append(names, o.Name), append(limits, limit)
			}
		}
		if len(names) == 0 {
			continue
		}
		q := tier.NewQuota(names, limits)
		qs.SetQuota(q)
		e.quotas.tiers = append(e.quotas.tiers, quotaTier{name: t.Name(), q: q, t: t})
	}
}

// assignOwner charges scope's chunks (id) to the owner of its namespace:
// from now on, and, the first time, those each tier already holds
// (tier.ScopeCharger), which may evict the owner's chunks to bring it
// within its quota.
func (e *Engine) assignOwner(id uint64, scope chunk.Scope) {
	if e.quotas == nil {
		return
	}
	for _, o := range e.quotas.owners {
		if !owns(o, scope.Namespace) {
			continue
		}
		for _, t := range e.quotas.tiers {
			if !t.q.Assigned(id) {
				t.q.Assign(id, o.Name)
				if c, ok := t.t.(tier.ScopeCharger); ok {
					c.ChargeScope(id)
				}
			}
		}
		return
	}
}

func owns(o QuotaOwner, ns string) bool {
	for _, e := range o.Namespaces {
		if config.NamespaceMatches(e, ns) {
			return true
		}
	}
	return false
}

// Quotas returns every owner's account in every tier that keeps quotas.
func (e *Engine) Quotas() []QuotaStats {
	if e.quotas == nil {
		return nil
	}
	var out []QuotaStats
	for _, t := range e.quotas.tiers {
		for _, s := range t.q.Stats() {
			out = append(out, QuotaStats{Tier: t.name, QuotaStats: s})
		}
	}
	return out
}
