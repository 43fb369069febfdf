package tenant

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvtier/chunk"
	"kvtier/config"
)

func cfgWith(ts ...config.Tenant) config.Config {
	c := config.Default()
	c.AdminToken, c.TCPToken = "admin-token-0123456789", "tcp-token-0123456789"
	c.Tenants = ts
	return c
}

func TestNewResolvesTokens(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tok")
	if err := os.WriteFile(file, []byte("file-token-0123456789\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"B_TOKEN": "env-token-0123456789"}
	s, err := New(cfgWith(
		config.Tenant{Name: "a", Token: "inline-token-0123456789", Namespaces: []string{"a"}},
		config.Tenant{Name: "b", TokenEnv: "B_TOKEN", Namespaces: []string{"b/*"}},
		config.Tenant{Name: "c", TokenFile: file, Namespaces: []string{"c"}},
	), func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	for tok, want := range map[string]string{"inline-token-0123456789": "a", "env-token-0123456789": "b",
		"file-token-0123456789": "c", "": "", "file-token-0123456789\r\n": "", "admin-token-0123456789": ""} {
		got := ""
		if tn := s.Match(tok); tn != nil {
			got = tn.Name
		}
		if got != want {
			t.Errorf("Match(%q) = %q, want %q", tok, got, want)
		}
	}
	b := s.Match("env-token-0123456789")
	if !b.AllowsScope(chunk.Scope{Namespace: "b/x"}) || b.AllowsScope(chunk.Scope{Namespace: "a"}) || b.AllowsScope(chunk.Scope{}) {
		t.Error("tenant b's namespaces")
	}
	if s, err := New(config.Default(), os.Getenv); s != nil || err != nil || s.Enabled() || s.Match("x") != nil {
		t.Errorf("no tenants: %v %v", s, err)
	}
}

func TestNewRefuses(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tok")
	if err := os.WriteFile(file, []byte("tcp-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"SAME": "inline-token-0123456789", "SHORT": "short"}
	for _, c := range []struct {
		t    config.Tenant
		want string
	}{
		{config.Tenant{Name: "x", TokenFile: file + ".missing", Namespaces: []string{"x"}}, "token_file"},
		{config.Tenant{Name: "x", TokenEnv: "UNSET", Namespaces: []string{"x"}}, "UNSET is not set"},
		{config.Tenant{Name: "x", TokenEnv: "SHORT", Namespaces: []string{"x"}}, "at least 16"},
		{config.Tenant{Name: "x", TokenFile: file, Namespaces: []string{"x"}}, "equals tcp_token"},
		{config.Tenant{Name: "x", TokenEnv: "SAME", Namespaces: []string{"x"}}, "equals tenant a's"},
	} {
		_, err := New(cfgWith(config.Tenant{Name: "a", Token: "inline-token-0123456789", Namespaces: []string{"a"}}, c.t),
			func(k string) string { return env[k] })
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.t, err, c.want)
		}
		if err != nil && (strings.Contains(err.Error(), "0123456789") || strings.Contains(err.Error(), "short")) {
			t.Errorf("an error shows a token: %v", err)
		}
	}
}
