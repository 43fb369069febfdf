// Package tenant binds tokens to namespaces (the tenants key,
// docs/security.md#tenants). The cache protocol and the admin API ask it
// which tenant a token is, and whether that tenant may reach a scope; a
// connection or request that presents the daemon's own tokens instead is
// not a tenant and reaches everything.
package tenant

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"

	"kvtier/chunk"
	"kvtier/config"
)

// Tenant is one configured tenant. Its token never leaves the package.
type Tenant struct {
	Name       string
	namespaces []string
	token      []byte
	// Refused counts this tenant's requests refused for reaching beyond
	// its namespaces (the scope opens and admin requests refused).
	Refused atomic.Uint64
}

// Allows reports whether namespace ns is one of the tenant's.
func (t *Tenant) Allows(ns string) bool {
	for _, e := range t.namespaces {
		if config.NamespaceMatches(e, ns) {
			return true
		}
	}
	return false
}

// AllowsScope reports whether scope belongs to one of the tenant's
// namespaces.
func (t *Tenant) AllowsScope(s chunk.Scope) bool { return t.Allows(s.Namespace) }

// Set is the configured tenants; a nil *Set has none.
type Set struct {
	tenants []*Tenant
}

// Minimum length of a resolved tenant token: a guessable one would undo
// the isolation it exists for.
const minTokenLen = 16

// New resolves the tenants' tokens (inline, from token_file or from the
// variable token_env, read with getenv) and checks them against each
// other and the daemon's own tokens. It returns nil, nil when cfg has no
// tenants. Errors name the tenant and the problem, never a token.
func New(cfg config.Config, getenv func(string) string) (*Set, error) {
	if len(cfg.Tenants) == 0 {
		return nil, nil
	}
	own := map[string]string{"tcp_token": cfg.TCPToken, "admin_token": cfg.AdminToken, "controller_token": cfg.ControllerToken}
	s := &Set{}
	var errs []error
	for i, ct := range cfg.Tenants {
		tok, err := resolve(ct, getenv)
		if err == nil && len(tok) < minTokenLen {
			err = fmt.Errorf("its token has %d characters; at least %d", len(tok), minTokenLen)
		}
		for key, v := range own {
			if err == nil && v != "" && tok == v {
				err = fmt.Errorf("its token equals %s; a tenant's token must be its own", key)
			}
		}
		for _, o := range s.tenants {
			if err == nil && subtle.ConstantTimeCompare(o.token, []byte(tok)) == 1 {
				err = fmt.Errorf("its token equals tenant %s's; each tenant needs its own", o.Name)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("tenants: tenant %d (%s): %w", i+1, ct.Name, err))
			continue
		}
		s.tenants = append(s.tenants, &Tenant{Name: ct.Name, namespaces: ct.Namespaces, token: []byte(tok)})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return s, nil
}

func resolve(t config.Tenant, getenv func(string) string) (string, error) {
	switch {
	case t.TokenFile != "":
		b, err := os.ReadFile(t.TokenFile)
		if err != nil {
			return "", fmt.Errorf("token_file: %w", err)
		}
		return strings.TrimRight(string(b), " \t\r\n"), nil
	case t.TokenEnv != "":
		v := getenv(t.TokenEnv)
		if v == "" {
			return "", fmt.Errorf("token_env: the variable %s is not set or empty", t.TokenEnv)
		}
		return v, nil
	}
	return t.Token, nil
}

// Enabled reports whether any tenant is configured.
func (s *Set) Enabled() bool { return s != nil && len(s.tenants) > 0 }

// Match returns the tenant whose token is token, or nil. Every tenant's
// token is compared, in constant time, whichever matches.
func (s *Set) Match(token string) *Tenant {
	if s == nil || token == "" {
		return nil
	}
	var found *Tenant
	for _, t := range s.tenants {
		if subtle.ConstantTimeCompare(t.token, []byte(token)) == 1 {
			found = t
		}
	}
	return found
}

// All returns the tenants, in configuration order.
func (s *Set) All() []*Tenant {
	if s == nil {
		return nil
	}
	return s.tenants
}
