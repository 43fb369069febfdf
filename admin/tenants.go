package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"kvtier/internal/webguard"
	"kvtier/tenant"
)

// Tenants on the admin API (docs/security.md#tenants): a request whose
// bearer token is a tenant's, not admin_token, may list keys and scopes
// and clear, each narrowed to the registered scopes of the tenant's
// namespaces, and nothing else. A scope outside them is refused the same
// way whether or not it holds chunks.

// tenantPaths are the endpoints a tenant's token opens.
var tenantPaths = map[string]bool{
	"GET /api/v1/keys":   true,
	"GET /api/v1/scopes": true,
	"POST /api/v1/clear": true,
}

type tenantKey struct{}

// SetTenants makes the admin API accept the tenants' tokens and export
// per-tenant metrics; call it before serving. Nil or no tenants changes
// nothing.
func (a *API) SetTenants(ts *tenant.Set) error {
	if !ts.Enabled() {
		return nil
	}
	a.guard.tenants = ts
	return a.Register(newTenantCollector(a.eng, ts))
}

// tenantOf returns the tenant of a request the guard let through with a
// tenant's token, or nil for full access.
func tenantOf(r *http.Request) *tenant.Tenant {
	t, _ := r.Context().Value(tenantKey{}).(*tenant.Tenant)
	return t
}

// serveTenant serves r when it presents a tenant's token (and not the
// admin token) and reports whether it did.
func (g *guard) serveTenant(w http.ResponseWriter, r *http.Request) bool {
	if !g.tenants.Enabled() || g.admin.Match(r) {
		return false
	}
	tok, ok := bearer(r)
	if !ok {
		return false
	}
	t := g.tenants.Match(tok)
	if t == nil {
		return false
	}
	var err error
	mutation := r.Method != http.MethodGet && r.Method != http.MethodHead
	switch {
	case mutation && webguard.CrossSite(r) != "":
		err = errors.New("cross-origin request refused")
	case !tenantPaths[r.Method+" "+r.URL.Path]:
		err = fmt.Errorf("a tenant's token reaches GET /api/v1/keys, GET /api/v1/scopes and POST /api/v1/clear only")
	}
	if err != nil {
		g.count.Add(1)
		t.Refused.Add(1)
		g.refused.Log("status", http.StatusForbidden, "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "tenant", t.Name, "why", err.Error())
		writeError(w, http.StatusForbidden, err)
		return true
	}
	g.next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, t)))
	return true
}

func bearer(r *http.Request) (string, bool) {
	const prefix = "Bearer "
	h := r.Header.Get("Authorization")
	if len(h) <= len(prefix) || h[:len(prefix)] != prefix {
		return "", false
	}
	return h[len(prefix):], true
}

// errNotTenantScope is the one answer to a scope outside a tenant's
// namespaces, registered or not, holding chunks or not.
var errNotTenantScope = errors.New("scope: not a registered scope of this tenant's namespaces")

// tenantScopes narrows the scope ids of a keys or clear request ([0] is
// every scope) to t's: every scope of t for [0], and an error for any
// other id that is not t's.
func (a *API) tenantScopes(t *tenant.Tenant, ids []uint64) ([]uint64, error) {
	if len(ids) == 1 && ids[0] == 0 {
		return a.eng.ScopesWhere(t.AllowsScope), nil
	}
	for _, id := range ids {
		if !a.tenantOwns(t, id) {
			t.Refused.Add(1)
			return nil, errNotTenantScope
		}
	}
	return ids, nil
}

func (a *API) tenantOwns(t *tenant.Tenant, id uint64) bool {
	s, ok := a.eng.Scope(id)
	return ok && t.AllowsScope(s)
}

// tenantKeyScopes narrows the scopes of GET /api/v1/keys to t's; a
// model's scopes are filtered, so a model only another tenant used reads
// as one nobody registered.
func (a *API) tenantKeyScopes(t *tenant.Tenant, ids []uint64, model string) ([]uint64, int, error) {
	if model == "" {
		ids, err := a.tenantScopes(t, ids)
		if err != nil {
			return nil, http.StatusForbidden, err
		}
		return ids, 0, nil
	}
	var own []uint64
	for _, id := range ids {
		if a.tenantOwns(t, id) {
			own = append(own, id)
		}
	}
	if len(own) == 0 {
		return nil, http.StatusBadRequest, fmt.Errorf("model: no scope of model %.100q was registered", model)
	}
	return own, 0, nil
}

// clearScopes clears each of scopes and sums what was removed by tier.
func (a *API) clearScopes(scopes []uint64) ([]int, []string) {
	total := make([]int, len(a.eng.TierNames()))
	var notCleared []string
	for _, id := range scopes {
		removed, nc := a.eng.Clear(id)
		for i := range min(len(removed), len(total)) {
			total[i] += removed[i]
		}
		notCleared = nc
	}
	return total, notCleared
}
