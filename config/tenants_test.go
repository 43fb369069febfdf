package config

import (
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const tenantsBase = "admin_token: admin-secret-0123456789\ntcp_token: tcp-secret-0123456789\n"

func TestTenantsLoad(t *testing.T) {
	c, err := Parse([]byte(tenantsBase+`tenants:
  - name: team-a
    token: token-of-team-a-0123
    namespaces: [a, "a-shared/*"]
  - name: team-b
    token_env: TEAM_B_TOKEN
    namespaces: b
`), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []Tenant{
		{Name: "team-a", Token: "token-of-team-a-0123", Namespaces: []string{"a", "a-shared/*"}},
		{Name: "team-b", TokenEnv: "TEAM_B_TOKEN", Namespaces: []string{"b"}},
	}
	if !reflect.DeepEqual(c.Tenants, want) {
		t.Fatalf("tenants %+v, want %+v", c.Tenants, want)
	}
	r := c.Redacted()
	if r.Tenants[0].Token != "REDACTED" || c.Tenants[0].Token != "token-of-team-a-0123" || r.Tenants[1].TokenEnv != "TEAM_B_TOKEN" {
		t.Errorf("redacted %+v (original %+v)", r.Tenants, c.Tenants)
	}
	if s := c.String(); strings.Contains(s, "token-of-team-a") {
		t.Errorf("String shows a tenant's token:\n%s", s)
	}
}

func TestTenantQuotasLoad(t *testing.T) {
	c, err := Parse([]byte(tenantsBase+`max_local_cpu_size: 4
local_disk: /var/lib/kvtier
max_local_disk_size: 100
tenants:
  - name: a
    token: token-of-team-a-0123
    namespaces: [a]
    ram_bytes: 512MiB
    disk_bytes: 4GB
  - name: b
    token: token-of-team-b-0123
    namespaces: [b]
    ram_bytes: 4GiB
`), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Tenants[0].RAMBytes != 512*MiB || c.Tenants[0].DiskBytes != 4*GB || c.Tenants[1].RAMBytes != 4*GiB || c.Tenants[1].DiskBytes != 0 {
		t.Fatalf("quotas %+v", c.Tenants)
	}
}

func TestTenantsFromEnv(t *testing.T) {
	c, err := FromEnv([]string{
		"KVTIER_ADMIN_TOKEN=admin-secret-0123456789",
		`KVTIER_TENANTS=[{"name": "x", "token_file": "/run/x", "namespaces": ["x/*"]}]`,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Tenants) != 1 || c.Tenants[0].TokenFile != "/run/x" || c.Tenants[0].Namespaces[0] != "x/*" {
		t.Fatalf("tenants %+v", c.Tenants)
	}
	if _, err := FromEnv([]string{"KVTIER_TENANTS=[{name: x, tokn: y}]"}); err == nil || !strings.Contains(err.Error(), `unknown key "tokn"`) {
		t.Errorf("a misspelt key: %v", err)
	}
}

func TestTenantsInvalid(t *testing.T) {
	for _, c := range []struct{ conf, want string }{
		{"tenants: [{name: a, token: tok-a-0123456789abc, namespaces: [a]}]", "need admin_token"},
		{tenantsBase + "admin_read_open: true\ntenants: [{name: a, token: tok-a-0123456789abc, namespaces: [a]}]", "admin_read_open"},
		{tenantsBase + "tenants: [{name: a, token: tok-a-0123456789abc}]", "want at least one namespace"},
		{tenantsBase + "tenants: [{name: a, token: tok-a-0123456789abc, namespaces: []}]", "want at least one namespace"},
		{tenantsBase + "tenants: [{name: a, namespaces: [a]}]", "exactly one of token, token_file and token_env, got 0"},
		{tenantsBase + "tenants: [{name: a, token: x, token_env: Y, namespaces: [a]}]", "got 2"},
		{tenantsBase + "tenants: [{name: a, token: admin-secret-0123456789, namespaces: [a]}]", "token equals admin_token"},
		{tenantsBase + "tenants: [{name: a, token: tcp-secret-0123456789, namespaces: [a]}]", "token equals tcp_token"},
		{tenantsBase + "tenants: [{name: a, token: tok-a-0123456789abc, namespaces: [a]}, {name: b, token: tok-a-0123456789abc, namespaces: [b]}]", "token equals tenant 1's"},
		{tenantsBase + "tenants: [{name: a, token: t1-0123456789abcdef, namespaces: [a]}, {name: a, token: t2-0123456789abcdef, namespaces: [b]}]", "name given twice"},
		{tenantsBase + "tenants: [{name: 'a b', token: t1-0123456789abcdef, namespaces: [a]}]", "want 1 to 64 letters"},
		{tenantsBase + "tenants: [{name: a, token: t1-0123456789abcdef, namespaces: ['']}]", "the shared one"},
		{tenantsBase + "tenants: [{name: a, token: t1-0123456789abcdef, namespaces: ['*']}]", "bare *"},
		{tenantsBase + "tenants: [{name: a, token: t1-0123456789abcdef, namespaces: ['a*b']}]", "may only end"},
		{tenantsBase + "tenants: [{name: a, token: t1-0123456789abcdef, namespaces: ['team/*']}, {name: b, token: t2-0123456789abcdef, namespaces: [team/x]}]", "overlaps"},
		{tenantsBase + "tenants: [{name: a, token: t1-0123456789abcdef, namespaces: [x]}, {name: b, token: t2-0123456789abcdef, namespaces: ['x*']}]", "overlaps"},
		{tenantsBase + "tenants: [{name: a, token: t1-0123456789abcdef, namespaces: [x, x]}]", "overlaps"},
		{tenantsBase + "tenants: {name: a}", "want a list of tenants"},
		{tenantsBase + "tenants: [a]", "want a mapping"},
		{tenantsBase + "tenants: [{name: a, name: b}]", "given twice"},
		{tenantsBase + "tenants: [{name: [a]}]", "name: want a string"},
		{tenantsBase + "tenants: [{name: a, token: t1-0123456789abcdef, namespaces: [a], ram_bytes: lots}]", "ram_bytes: want a byte count"},
		{tenantsBase + "tenants: [{name: a, token: t1-0123456789abcdef, namespaces: [a], ram_bytes: [1]}]", "ram_bytes: want a size"},
		{tenantsBase + "max_local_cpu_size: 1\ntenants: [{name: a, token: t1-0123456789abcdef, namespaces: [a], ram_bytes: 2GiB}]", "more than the RAM tier's 1GiB"},
		{tenantsBase + "tenants: [{name: a, token: t1-0123456789abcdef, namespaces: [a], disk_bytes: 1GiB}]", "no disk tier"},
		{tenantsBase + "local_disk: /d\nmax_local_disk_size: 1\ntenants: [{name: a, token: t1-0123456789abcdef, namespaces: [a], disk_bytes: 3GB}]", "more than the disk tier's"},
	} {
		_, err := Parse([]byte(c.conf), "t.yaml")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s\n  error %v, want one saying %q", c.conf, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret-0123") {
			t.Errorf("an error shows a token: %v", err)
		}
	}
}

func TestNamespaceMatches(t *testing.T) {
	for _, c := range []struct {
		entry, ns string
		want      bool
	}{
		{"a", "a", true}, {"a", "ab", false}, {"a", "", false},
		{"team/*", "team/x", true}, {"team/*", "team/", true}, {"team/*", "team", false}, {"team/*", "other/x", false},
	} {
		if got := NamespaceMatches(c.entry, c.ns); got != c.want {
			t.Errorf("NamespaceMatches(%q, %q) = %v", c.entry, c.ns, got)
		}
	}
}

// FuzzTenants feeds arbitrary text to the tenants decoder (the file's
// key and KVTIER_TENANTS): never a panic, and a list it accepts marshals
// to one it reads back the same.
func FuzzTenants(f *testing.F) {
	for _, s := range []string{"", "[]", "[{name: a, token: b, namespaces: [c]}]", `[{"name": "a", "namespaces": "x y"}]`,
		"[{name: &a x, token: *a}]", "{}", "[[1]]", "[{namespaces: [[a]]}]", "- name: a\n  token_file: /x\n",
		"[{name: a, ram_bytes: 1.5KiB, disk_bytes: 7}]", "[{ram_bytes: -1}]", "[{disk_bytes: 99999999999999999999}]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var got []Tenant
		if err := parseTenants(reflect.ValueOf(&got).Elem(), s); err != nil {
			return
		}
		out, err := yaml.Marshal(got)
		if err != nil {
			t.Fatal(err)
		}
		var back []Tenant
		if err := parseTenants(reflect.ValueOf(&back).Elem(), string(out)); err != nil {
			t.Fatalf("%q: marshalled %q does not decode: %v", s, out, err)
		}
		if !reflect.DeepEqual(got, back) {
			t.Fatalf("%q: round trip %+v → %+v", s, got, back)
		}
	})
}
