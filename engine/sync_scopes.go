package engine

import "context"

// SyncScopes is Sync with the redone and missing chunks counted only in
// the scopes visible selects: a tenant's flush (docs/security.md#tenants)
// must learn nothing of other tenants' chunks, and their losses must not
// make its reply say "not durable". It waits for and writes again every
// scope's chunks, as Sync does; Pending counts every scope's writes.
func (e *Engine) SyncScopes(ctx context.Context, visible func(scope uint64) bool) []TierSync {
	rep, _ := e.mgr.SyncScopes(ctx, visible)
	out := make([]TierSync, 0, len(rep))
	for _, t := range rep {
		out = append(out, TierSync{Tier: t.Tier, Pending: t.Pending, Redone: t.Redone, Missing: t.Missing})
	}
	return out
}
