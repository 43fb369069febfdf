package config

import (
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// Tenant binds a token to namespaces (the Namespace field of the scopes
// connectors open). A client that presents the token reaches only the
// scopes whose namespace one of Namespaces names: an entry is a namespace
// as written, or a prefix ending in "*" ("team-a/*" covers every
// namespace starting with "team-a/"). The token is given inline, read
// from a file (TokenFile, trailing white space trimmed) or from an
// environment variable (TokenEnv): exactly one of the three. RAMBytes and
// DiskBytes, when set, are the tenant's quotas in the RAM and disk tiers
// (quota.go); zero is no quota.
type Tenant struct {
	Name       string   `yaml:"name" json:"name"`
	Token      string   `yaml:"token,omitempty" json:"token,omitempty"`
	TokenFile  string   `yaml:"token_file,omitempty" json:"token_file,omitempty"`
	TokenEnv   string   `yaml:"token_env,omitempty" json:"token_env,omitempty"`
	Namespaces []string `yaml:"namespaces" json:"namespaces"`
	RAMBytes   Size     `yaml:"ram_bytes,omitempty" json:"ram_bytes,omitempty"`
	DiskBytes  Size     `yaml:"disk_bytes,omitempty" json:"disk_bytes,omitempty"`
}

// Bounds on the tenants list: generous, and small enough that a stray
// file cannot make the daemon hold much.
const (
	maxTenants          = 1024
	maxTenantNamespaces = 256
	maxTenantString     = 1024
)

var (
	tenantsType    = reflect.TypeFor[[]Tenant]()
	tenantNameRule = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
)

// decodeTenants decodes the tenants key: a list of mappings with the keys
// of Tenant, each checked by name so a typo is an error, not a tenant
// without a token.
func decodeTenants(dst reflect.Value, n *yaml.Node) error {
	if n.Kind != yaml.SequenceNode {
		return wantError(dst.Type(), n)
	}
	if len(n.Content) > maxTenants {
		return fmt.Errorf("%d tenants; at most %d", len(n.Content), maxTenants)
	}
	if len(n.Content) == 0 { // "tenants: []" is no tenants, as omitting the key
		dst.Set(reflect.Zero(dst.Type()))
		return nil
	}
	out := make([]Tenant, 0, len(n.Content))
	for i, item := range n.Content {
		t, err := decodeTenant(item)
		if err != nil {
			return fmt.Errorf("tenant %d: %w", i+1, err)
		}
		out = append(out, t)
	}
	dst.Set(reflect.ValueOf(out))
	return nil
}

func decodeTenant(n *yaml.Node) (Tenant, error) {
	var t Tenant
	if n.Kind != yaml.MappingNode {
		return t, fmt.Errorf("want a mapping (name, token, namespaces), got %s", describe(n))
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, v := n.Content[i].Value, n.Content[i+1]
		if seen[key] {
			return t, fmt.Errorf("key %q given twice", clip(key))
		}
		seen[key] = true
		var dst *string
		switch key {
		case "name":
			dst = &t.Name
		case "token":
			dst = &t.Token
		case "token_file":
			dst = &t.TokenFile
		case "token_env":
			dst = &t.TokenEnv
		case "namespaces":
			var list []string
			if err := decodeList(reflect.ValueOf(&list).Elem(), v); err != nil {
				return t, fmt.Errorf("namespaces: %w", err)
			}
			t.Namespaces = list
			continue
		case "ram_bytes", "disk_bytes":
			if err := decodeQuota(&t, key, v); err != nil {
				return t, err
			}
			continue
		default:
			return t, fmt.Errorf("unknown key %q (want name, token, token_file, token_env, namespaces, ram_bytes, disk_bytes)", clip(key))
		}
		if v.Kind != yaml.ScalarNode {
			return t, fmt.Errorf("%s: want a string, got %s", key, describe(v))
		}
		*dst = v.Value
	}
	return t, nil
}

// parseTenants reads KVTIER_TENANTS: the same list in YAML flow or JSON
// syntax.
func parseTenants(dst reflect.Value, s string) error {
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(s), &n); err != nil {
		return fmt.Errorf("want %s in YAML or JSON: %v", want(dst.Type()), err)
	}
	if n.Kind == 0 { // empty: no tenants
		dst.Set(reflect.Zero(dst.Type()))
		return nil
	}
	return decodeTenants(dst, n.Content[0])
}

// redactTenants returns a copy of ts with inline tokens hidden; file and
// variable names are not secret and stay.
func redactTenants(ts []Tenant) []Tenant {
	if ts == nil {
		return nil
	}
	out := slices.Clone(ts)
	for i := range out {
		if out[i].Token != "" {
			out[i].Token = redacted
		}
	}
	return out
}

// validateTenants checks the tenants list as far as it can without
// reading token files or the environment (package tenant does that when
// the daemon starts).
func (c Config) validateTenants(bad func(key, format string, args ...any)) {
	if len(c.Tenants) == 0 {
		return
	}
	if c.AdminToken == "" {
		bad("tenants", "need admin_token: without it every local process may list and clear every namespace through the admin API")
	}
	if c.AdminReadOpen {
		bad("tenants", "admin_read_open would let anyone list every tenant's keys; keep it false with tenants")
	}
	c.validateQuotas(bad)
	names := map[string]bool{}
	var entries []nsEntry
	for i, t := range c.Tenants {
		who := fmt.Sprintf("tenant %d (%s)", i+1, clip(t.Name))
		if !tenantNameRule.MatchString(t.Name) {
			bad("tenants", "tenant %d: name %q: want 1 to 64 letters, digits, '_', '.' or '-'", i+1, clip(t.Name))
		} else if names[t.Name] {
			bad("tenants", "%s: name given twice", who)
		}
		names[t.Name] = true
		sources := 0
		for _, s := range []string{t.Token, t.TokenFile, t.TokenEnv} {
			if s != "" {
				sources++
			}
		}
		if sources != 1 {
			bad("tenants", "%s: give exactly one of token, token_file and token_env, got %d", who, sources)
		}
		if t.Token != "" {
			// Tokens are compared, never printed.
			for key, other := range map[string]string{"tcp_token": c.TCPToken, "admin_token": c.AdminToken, "controller_token": c.ControllerToken} {
				if t.Token == other {
					bad("tenants", "%s: token equals %s; a tenant's token must be its own", who, key)
				}
			}
			for j := range i {
				if c.Tenants[j].Token == t.Token {
					bad("tenants", "%s: token equals tenant %d's; each tenant needs its own", who, j+1)
				}
			}
		}
		if len(t.Namespaces) == 0 {
			bad("tenants", "%s: namespaces: want at least one namespace or prefix", who)
		}
		if len(t.Namespaces) > maxTenantNamespaces {
			bad("tenants", "%s: %d namespaces; at most %d", who, len(t.Namespaces), maxTenantNamespaces)
		}
		for _, ns := range t.Namespaces {
			e, err := parseNamespace(ns)
			if err != nil {
				bad("tenants", "%s: namespace %q: %v", who, clip(ns), err)
				continue
			}
			e.tenant = i
			for _, o := range entries {
				if o.overlaps(e) {
					bad("tenants", "%s: namespace %q overlaps %q of tenant %d: a namespace belongs to one tenant", who, clip(ns), clip(o.text), o.tenant+1)
				}
			}
			entries = append(entries, e)
		}
	}
}

// nsEntry is one namespaces entry: an exact namespace, or a prefix.
type nsEntry struct {
	text   string
	prefix bool
	stem   string // text without its "*"
	tenant int
}

func parseNamespace(ns string) (nsEntry, error) {
	stem, prefix := strings.CutSuffix(ns, "*")
	switch {
	case ns == "":
		return nsEntry{}, fmt.Errorf("empty: the empty namespace is the shared one and belongs to no tenant")
	case len(ns) > maxTenantString:
		return nsEntry{}, fmt.Errorf("longer than %d bytes", maxTenantString)
	case stem == "":
		return nsEntry{}, fmt.Errorf("a bare * would be every namespace: use tcp_token and admin_token for that")
	case strings.Contains(stem, "*"):
		return nsEntry{}, fmt.Errorf("* may only end a prefix")
	}
	return nsEntry{text: ns, prefix: prefix, stem: stem}, nil
}

// overlaps reports whether some namespace matches both entries.
func (a nsEntry) overlaps(b nsEntry) bool {
	switch {
	case a.prefix && strings.HasPrefix(b.stem, a.stem):
		return true
	case b.prefix && strings.HasPrefix(a.stem, b.stem):
		return true
	}
	return !a.prefix && !b.prefix && a.stem == b.stem
}

// NamespaceMatches reports whether namespace ns is covered by entry (a
// namespace, or a prefix ending in "*"), as validated by Validate.
func NamespaceMatches(entry, ns string) bool {
	if stem, ok := strings.CutSuffix(entry, "*"); ok {
		return strings.HasPrefix(ns, stem)
	}
	return entry == ns
}
