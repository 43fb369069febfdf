package server_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvtier/admin"
	"kvtier/chunk"
	"kvtier/client"
	"kvtier/wire"
)

// Tenant isolation against a real `kvtier serve`: tenant beta cannot
// read, detect (LOOKUP), list or clear tenant alpha's chunks, over TCP,
// the local socket or the admin API; alpha can; the daemon's own tokens
// reach everything; a wrong or missing token is refused.

const (
	tAdmin = "admin-token-0123456789"
	tTCP   = "tcp-token-0123456789"
	tAlpha = "alpha-token-0123456789"
	tBeta  = "beta-token-0123456789"
)

var (
	alphaScope = chunk.Scope{Model: "m", WorldSize: 1, Format: "f", Namespace: "alpha"}
	betaScope  = chunk.Scope{Model: "m", WorldSize: 1, Format: "f", Namespace: "beta/one"}
	// neverScope is in alpha's namespace but never stored: beta must be
	// answered for it exactly as for alphaScope.
	neverScope = chunk.Scope{Model: "never", WorldSize: 1, Format: "f", Namespace: "alpha"}
)

func startTenantDaemon(t *testing.T) *proc {
	dir := t.TempDir()
	betaFile := filepath.Join(dir, "beta.token")
	if err := os.WriteFile(betaFile, []byte(tBeta+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`max_local_cpu_size: 0.0625
admin_token: %s
tcp_token: %s
tenants:
  - name: alpha
    token: %s
    namespaces: [alpha]
  - name: beta
    token_file: %s
    namespaces: ["beta/*"]
`, tAdmin, tTCP, tAlpha, betaFile)
	return startProc(t, dir, conf)
}

func tenantChunks(c *client.Client, salt byte) (tokens []uint32, data [][]byte) {
	n := c.ChunkTokens()
	for i := range 2 * n {
		tokens = append(tokens, uint32(i)*7+uint32(salt))
	}
	for j := range 2 {
		data = append(data, bytes.Repeat([]byte{salt, byte(j)}, 2048))
	}
	return tokens, data
}

func dialAs(t *testing.T, p *proc, local bool, token string) (*client.Client, error) {
	t.Helper()
	ctx := context.Background()
	o := client.Options{Token: token, Name: "tenant-test"}
	var c *client.Client
	var err error
	if local {
		c, err = client.DialUnix(ctx, p.Sock, o)
	} else {
		c, err = client.DialTCP(ctx, p.TCP, o)
	}
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

func mustDial(t *testing.T, p *proc, local bool, token string) *client.Client {
	t.Helper()
	c, err := dialAs(t, p, local, token)
	if err != nil {
		t.Fatalf("dial (local %v): %v", local, err)
	}
	return c
}

// lookupOwn opens scope on c and looks its prompt up.
func lookupOwn(t *testing.T, c *client.Client, sc chunk.Scope, tokens []uint32) uint32 {
	t.Helper()
	ctx := context.Background()
	h, err := c.Scope(ctx, sc)
	if err != nil {
		t.Fatalf("scope %+v: %v", sc, err)
	}
	r, err := c.Lookup(ctx, client.Tokens(h, tokens, 0), 0)
	if err != nil {
		t.Fatal(err)
	}
	return r.Chunks
}

func TestTenantIsolationProcess(t *testing.T) {
	p := startTenantDaemon(t)
	ctx := context.Background()
	for _, local := range []bool{false, true} {
		t.Run(map[bool]string{false: "tcp", true: "local"}[local], func(t *testing.T) {
			alpha := mustDial(t, p, local, tAlpha)
			if alpha.Local() {
				t.Error("a tenant's local connection was given the arena, which holds every tenant's chunks")
			}
			salt := byte(map[bool]int{false: 1, true: 2}[local])
			tokens, data := tenantChunks(alpha, salt)
			h, err := alpha.Scope(ctx, alphaScope)
			if err != nil {
				t.Fatal(err)
			}
			if n, err := alpha.Store(ctx, client.Tokens(h, tokens, 0), data); err != nil || n != 2 {
				t.Fatalf("alpha stores: %d %v", n, err)
			}
			dst := [][]byte{make([]byte, 4096), make([]byte, 4096)}
			if n, _, err := alpha.Retrieve(ctx, client.Tokens(h, tokens, 0), dst); err != nil || n != 2 || !bytes.Equal(dst[1], data[1]) {
				t.Fatalf("alpha reads its own chunks: %d %v", n, err)
			}

			beta := mustDial(t, p, local, tBeta)
			_, errA := beta.Scope(ctx, alphaScope)
			_, errNever := beta.Scope(ctx, neverScope)
			if !client.IsStatus(errA, wire.StatusUnauthorized) || !client.IsStatus(errNever, wire.StatusUnauthorized) {
				t.Fatalf("beta opens alpha's scope: %v; a never-used one: %v", errA, errNever)
			}
			if errA.Error() != errNever.Error() {
				t.Errorf("beta can tell a stored scope from an unused one: %q vs %q", errA, errNever)
			}
			// Raw keys naming alpha's scope id: refused, not a miss.
			keys := adminKeys(t, p, tAdmin, "")
			if len(keys) < 2 {
				t.Fatalf("the admin token lists %d keys", len(keys))
			}
			raw := rawKeys(t, keys)
			if _, err := beta.Lookup(ctx, client.Raw(raw), 0); !client.IsStatus(err, wire.StatusUnauthorized) {
				t.Errorf("beta LOOKUP of alpha's raw keys: %v", err)
			}
			res, err := beta.LookupBatch(ctx, []wire.Lookup{{Keys: client.Raw(raw)}})
			if err != nil || len(res) != 1 || res[0].Status != wire.StatusUnauthorized {
				t.Errorf("beta LOOKUP_BATCH of alpha's raw keys: %+v %v", res, err)
			}
			if _, _, err := beta.Retrieve(ctx, client.Raw(raw[:1]), dst[:1]); !client.IsStatus(err, wire.StatusUnauthorized) {
				t.Errorf("beta RETRIEVE of alpha's raw keys: %v", err)
			}
			if _, err := beta.Stats(ctx); !client.IsStatus(err, wire.StatusUnauthorized) {
				t.Errorf("beta STATS: %v", err)
			}
			// beta's CLEAR of everything clears only its own.
			if n := lookupOwn(t, beta, betaScope, tokens); n != 0 {
				t.Fatalf("beta sees %d chunks in its empty scope", n)
			}
			if _, err := beta.Clear(ctx, 0); err != nil {
				t.Fatal(err)
			}
			if n := lookupOwn(t, alpha, alphaScope, tokens); n != 2 {
				t.Fatalf("after beta's CLEAR, alpha finds %d of its 2 chunks", n)
			}
			// The TCP token reaches every namespace, on the local socket too.
			full := mustDial(t, p, local, tTCP)
			if local && !full.Local() {
				t.Error("the TCP token's local connection got no arena")
			}
			if n := lookupOwn(t, full, alphaScope, tokens); n != 2 {
				t.Fatalf("the TCP token finds %d of alpha's 2 chunks", n)
			}
			for _, bad := range []string{"", "wrong-token-0123456789", tAdmin} {
				if _, err := dialAs(t, p, local, bad); !client.IsStatus(err, wire.StatusUnauthorized) {
					t.Errorf("token %q: %v", bad, err)
				}
			}
			// alpha clears its own.
			if _, err := alpha.Clear(ctx, 0); err != nil {
				t.Fatal(err)
			}
			if n := lookupOwn(t, full, alphaScope, tokens); n != 0 {
				t.Fatalf("after alpha's CLEAR %d chunks are left", n)
			}
		})
	}
	for _, tok := range []string{tAdmin, tTCP, tAlpha, tBeta} {
		if strings.Contains(p.Log.String(), tok) {
			t.Errorf("the daemon's log shows a token")
		}
	}
}

func TestTenantAdminProcess(t *testing.T) {
	p := startTenantDaemon(t)
	ctx := context.Background()
	alpha := mustDial(t, p, false, tAlpha)
	tokens, data := tenantChunks(alpha, 9)
	h, err := alpha.Scope(ctx, alphaScope)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := alpha.Store(ctx, client.Tokens(h, tokens, 0), data); err != nil || n != 2 {
		t.Fatalf("alpha stores: %d %v", n, err)
	}
	beta := mustDial(t, p, false, tBeta)
	lookupOwn(t, beta, betaScope, tokens) // registers beta's scope

	all := adminKeys(t, p, tAdmin, "")
	if len(all) != 2 {
		t.Fatalf("the admin token lists %d keys, want 2", len(all))
	}
	if got := adminKeys(t, p, tAlpha, ""); len(got) != 2 {
		t.Errorf("alpha lists %d of its keys, want 2", len(got))
	}
	if got := adminKeys(t, p, tBeta, ""); len(got) != 0 {
		t.Errorf("beta lists %d of alpha's keys", len(got))
	}
	scope := all[0].Scope
	st, body := adminDo(t, p, tBeta, "GET", "/api/v1/keys?scope="+scope, "")
	st2, body2 := adminDo(t, p, tBeta, "GET", fmt.Sprintf("/api/v1/keys?scope=%016x", neverScopeID(t, p)), "")
	if st != http.StatusForbidden || st2 != st || body != body2 {
		t.Errorf("beta lists alpha's scope: %d %s; a scope never stored: %d %s", st, body, st2, body2)
	}
	if st, body := adminDo(t, p, tBeta, "GET", "/api/v1/keys?model=m", ""); st != http.StatusOK || strings.Contains(body, scope) {
		t.Errorf("beta lists model m: %d %s", st, body)
	}
	if st, body := adminDo(t, p, tBeta, "GET", "/api/v1/scopes", ""); st != http.StatusOK || strings.Contains(body, scope) {
		t.Errorf("beta's scopes: %d %s", st, body)
	}
	if st, body := adminDo(t, p, tAlpha, "GET", "/api/v1/scopes", ""); st != http.StatusOK || !strings.Contains(body, scope) {
		t.Errorf("alpha's scopes: %d %s", st, body)
	}
	for _, path := range []string{"/api/v1/stats", "/api/v1/config", "/metrics"} {
		if st, _ := adminDo(t, p, tBeta, "GET", path, ""); st != http.StatusForbidden {
			t.Errorf("beta GET %s: %d", path, st)
		}
	}
	if st, _ := adminDo(t, p, tBeta, "POST", "/api/v1/flush", ""); st != http.StatusForbidden {
		t.Errorf("beta POST flush: %d", st)
	}
	if st, _ := adminDo(t, p, "wrong-token-0123456789", "GET", "/api/v1/keys", ""); st != http.StatusUnauthorized {
		t.Errorf("a wrong token lists keys: %d", st)
	}
	_, metrics := adminDo(t, p, tAdmin, "GET", "/metrics", "")
	for _, want := range []string{
		`kvtier_tenant_chunks{tenant="alpha",tier="mem"} 2`,
		`kvtier_tenant_bytes{tenant="alpha",tier="mem"} 8192`,
		`kvtier_tenant_chunks{tenant="beta",tier="mem"} 0`,
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if !strings.Contains(metrics, `kvtier_tenant_refused_total{tenant="beta"} `) || strings.Contains(metrics, `kvtier_tenant_refused_total{tenant="beta"} 0`+"\n") {
		t.Errorf("beta's refusals are not counted:\n%s", grepLines(metrics, "kvtier_tenant_"))
	}
	if st, body := adminDo(t, p, tBeta, "POST", "/api/v1/clear", `{"scope": "0x`+scope+`"}`); st != http.StatusForbidden {
		t.Errorf("beta clears alpha's scope: %d %s", st, body)
	}
	if st, body := adminDo(t, p, tBeta, "POST", "/api/v1/clear", ""); st != http.StatusOK {
		t.Errorf("beta clears its own: %d %s", st, body)
	}
	if n := lookupOwn(t, alpha, alphaScope, tokens); n != 2 {
		t.Fatalf("after beta's clears alpha finds %d of 2 chunks", n)
	}
	st, body = adminDo(t, p, tAlpha, "POST", "/api/v1/clear", "")
	var res admin.ClearResult
	if err := json.Unmarshal([]byte(body), &res); st != http.StatusOK || err != nil || res.Removed["mem"] != 2 {
		t.Fatalf("alpha clears its own: %d %s", st, body)
	}
	if n := lookupOwn(t, alpha, alphaScope, tokens); n != 0 {
		t.Fatalf("after alpha's clear %d chunks are left", n)
	}
}

// neverScopeID registers neverScope (through the TCP token) and returns its id.
func neverScopeID(t *testing.T, p *proc) uint64 {
	full := mustDial(t, p, false, tTCP)
	tokens, data := tenantChunks(full, 3)
	h, err := full.Scope(context.Background(), neverScope)
	if err != nil {
		t.Fatal(err)
	}
	// Store and clear one chunk to learn the id from the admin keys.
	if _, err := full.Store(context.Background(), client.Tokens(h, tokens, 0), data[:1]); err != nil {
		t.Fatal(err)
	}
	before := adminKeys(t, p, tAdmin, "")
	var id uint64
	for _, k := range before {
		if k.Scope != adminKeys(t, p, tAlpha, "")[0].Scope {
			fmt.Sscanf(k.Scope, "%x", &id)
		}
	}
	if _, err := full.Clear(context.Background(), h); err != nil || id == 0 {
		t.Fatalf("never scope id %x: %v", id, err)
	}
	return id
}

func adminDo(t *testing.T, p *proc, token, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, p.Admin+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func adminKeys(t *testing.T, p *proc, token, query string) []admin.KeyInfo {
	t.Helper()
	st, body := adminDo(t, p, token, "GET", "/api/v1/keys"+query, "")
	if st != http.StatusOK {
		t.Fatalf("GET /api/v1/keys: %d %s", st, body)
	}
	var kl admin.KeyList
	if err := json.Unmarshal([]byte(body), &kl); err != nil {
		t.Fatal(err)
	}
	return kl.Keys
}

func rawKeys(t *testing.T, keys []admin.KeyInfo) []chunk.Key {
	t.Helper()
	var out []chunk.Key
	for _, k := range keys {
		var ck chunk.Key
		if _, err := fmt.Sscanf(k.Scope, "%x", &ck.Scope); err != nil {
			t.Fatal(err)
		}
		h, err := hex.DecodeString(k.Hash)
		if err != nil || len(h) != len(ck.Hash) {
			t.Fatalf("hash %q: %v", k.Hash, err)
		}
		copy(ck.Hash[:], h)
		out = append(out, ck)
	}
	return out
}

func grepLines(s, substr string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		if strings.Contains(line, substr) {
			b.WriteString(line)
		}
	}
	return b.String()
}
