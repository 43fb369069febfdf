package server

import (
	"crypto/subtle"

	"kvtier/chunk"
	"kvtier/wire"
)

// Tenants (docs/security.md#tenants). A connection that presents a
// tenant's token in HELLO is bound to that tenant: it may open only the
// scopes of the tenant's namespaces, and every other way of naming chunks
// is narrowed to those scopes. On the local socket a tenant gets no
// arena (the shared memory holds every tenant's chunks): it stores and
// reads with STORE and RETRIEVE, as over TCP. A forbidden scope is refused when it is
// opened, whatever the daemon holds of it, so a tenant cannot tell
// another's chunks from chunks that were never stored.

// authenticate checks HELLO's token. Without tenants it is as before: the
// TCP token on TCP, nothing on the local socket (its file mode guards
// it). With tenants every connection, local ones too, presents a token:
// the TCP token reaches everything, a tenant's token its namespaces.
func (s *session) authenticate(token string) *requestError {
	ts := s.svc.opts.Tenants
	if !ts.Enabled() {
		if !s.local && !tokenMatches(s.svc.opts.Token, token) {
			return fatal(wire.StatusUnauthorized, "wrong or missing token")
		}
		return nil
	}
	full := s.svc.opts.Token != "" && subtle.ConstantTimeCompare([]byte(s.svc.opts.Token), []byte(token)) == 1
	t := ts.Match(token)
	switch {
	case full:
		return nil
	case t != nil:
		s.tenant = t
		return nil
	}
	return fatal(wire.StatusUnauthorized, "wrong or missing token: this daemon has tenants, and every connection presents a tenant's token or the TCP token")
}

// scopeAllowed refuses a scope outside the tenant's namespaces.
func (s *session) scopeAllowed(sc chunk.Scope) *requestError {
	if s.tenant == nil || s.tenant.AllowsScope(sc) {
		return nil
	}
	s.tenant.Refused.Add(1)
	return fail(wire.StatusUnauthorized, "namespace %q is not one of tenant %s's", sc.Namespace, s.tenant.Name)
}

// rawAllowed refuses raw keys of a tenant's connection whose scope id is
// not one the connection opened: the scope's id alone does not say
// whose it is.
func (s *session) rawAllowed(keys []chunk.Key) *requestError {
	if s.tenant == nil {
		return nil
	}
	for _, k := range keys {
		if !s.opened(k.Scope) {
			s.tenant.Refused.Add(1)
			return fail(wire.StatusUnauthorized, "raw keys of a tenant's connection must name scopes it opened with SCOPE")
		}
	}
	return nil
}

func (s *session) opened(id uint64) bool {
	for i := range s.scopes {
		if s.scopes[i].id == id {
			return true
		}
	}
	return false
}

// tenantOp refuses the requests a tenant may not make at all: STATS
// (the whole daemon's counters) and RECEIVE (daemon to daemon, with data
// frames that cannot be skipped, so the connection closes).
func (s *session) tenantOp(op wire.Op) *requestError {
	if s.tenant == nil {
		return nil
	}
	switch op {
	case wire.OpStats:
		return fail(wire.StatusUnauthorized, "STATS reports the whole daemon: a tenant's token may not read it")
	case wire.OpReceive, wire.OpReceiveLayers:
		return fatal(wire.StatusUnauthorized, "RECEIVE is for daemons: a tenant's token may not push chunks here")
	}
	return nil
}

// clearTenant serves CLEAR of every scope for a tenant: the registered
// scopes of its namespaces. It returns the RAM chunks dropped.
func (s *session) clearTenant() uint64 {
	var n uint64
	for _, id := range s.svc.eng.ScopesWhere(s.tenant.AllowsScope) {
		removed, _ := s.svc.eng.Clear(id)
		n += uint64(removed[0])
	}
	return n
}

// notePush remembers a transfer a tenant's connection started, the only
// ones whose PUSH_STATUS it may read.
func (s *session) notePush(id uint64) {
	if s.tenant == nil {
		return
	}
	if s.pushed == nil {
		s.pushed = make(map[uint64]struct{})
	}
	if len(s.pushed) < maxTenantPushes {
		s.pushed[id] = struct{}{}
	}
}

// maxTenantPushes bounds the transfers a tenant's connection remembers.
const maxTenantPushes = 4096

func (s *session) pushVisible(id uint64) bool {
	if s.tenant == nil {
		return true
	}
	_, ok := s.pushed[id]
	return ok
}
