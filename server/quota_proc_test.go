package server_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"kvtier/client"
	"kvtier/wire"
)

// Tenants' quotas against a real `kvtier serve` with RAM and disk tiers:
// alpha, with quotas of 8 chunks in RAM and about as many on disk, stores
// 40 chunks; only alpha's own chunks are evicted, and beta's (no quota)
// all read back byte-exact from RAM and stay on disk. With alpha's
// resident chunks leased by another connection, alpha's next STORE is
// refused with NO_SPACE while beta still stores.

const quotaChunk = 4096

func startQuotaDaemon(t *testing.T) *proc {
	dir := t.TempDir()
	return startProc(t, dir, quotaConf(dir, "32KiB", "72KiB"))
}

// quotaConf is the configuration of a daemon in dir with RAM and disk
// tiers of 1/16 GiB each and two tenants: alpha, in namespace alpha, with
// the quotas given, and beta, in beta/*, without quotas.
func quotaConf(dir, alphaRAM, alphaDisk string) string {
	return fmt.Sprintf(`max_local_cpu_size: 0.0625
local_disk: %s
max_local_disk_size: 0.0625
admin_token: %s
tcp_token: %s
tenants:
  - name: alpha
    token: %s
    namespaces: [alpha]
    ram_bytes: %s
    disk_bytes: %s
  - name: beta
    token: %s
    namespaces: ["beta/*"]
`, filepath.Join(dir, "disk"), tAdmin, tTCP, tAlpha, alphaRAM, alphaDisk, tBeta)
}

// quotaPrompt returns prompt i's tokens (two chunks) and its chunks'
// bytes, distinct for every (salt, i, chunk).
func quotaPrompt(c *client.Client, salt byte, i int) ([]uint32, [][]byte) {
	n := c.ChunkTokens()
	var tokens []uint32
	for j := range 2 * n {
		tokens = append(tokens, uint32(i)<<20|uint32(salt)<<16|uint32(j))
	}
	return tokens, [][]byte{bytes.Repeat([]byte{salt, byte(i), 0}, quotaChunk/3+1)[:quotaChunk],
		bytes.Repeat([]byte{salt, byte(i), 1}, quotaChunk/3+1)[:quotaChunk]}
}

// metricOf returns a labelled sample of /metrics, read with the admin token.
func metricOf(t *testing.T, p *proc, sample string) float64 {
	t.Helper()
	_, body := adminDo(t, p, tAdmin, "GET", "/metrics", "")
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s:\n%s", sample, grepLines(body, "kvtier_tenant_"))
	return 0
}

func TestTenantQuotaProcess(t *testing.T) {
	p := startQuotaDaemon(t)
	ctx := context.Background()
	alpha, beta := mustDial(t, p, false, tAlpha), mustDial(t, p, false, tBeta)
	ha, err := alpha.Scope(ctx, alphaScope)
	if err != nil {
		t.Fatal(err)
	}
	hb, err := beta.Scope(ctx, betaScope)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		tokens, data := quotaPrompt(beta, 2, i)
		if n, err := beta.Store(ctx, client.Tokens(hb, tokens, 0), data); err != nil || n != 2 {
			t.Fatalf("beta stores prompt %d: %d %v", i, n, err)
		}
	}
	for i := range 20 {
		tokens, data := quotaPrompt(alpha, 1, i)
		if n, err := alpha.Store(ctx, client.Tokens(ha, tokens, 0), data); err != nil || n != 2 {
			t.Fatalf("alpha stores prompt %d: %d %v", i, n, err)
		}
	}
	if _, err := mustDial(t, p, false, tTCP).Flush(ctx); err != nil {
		t.Fatal(err)
	}
	dst := [][]byte{make([]byte, quotaChunk), make([]byte, quotaChunk)}
	for i := range 3 {
		tokens, data := quotaPrompt(beta, 2, i)
		n, _, err := beta.Retrieve(ctx, client.Tokens(hb, tokens, 0), dst)
		if err != nil || n != 2 || !bytes.Equal(dst[0], data[0]) || !bytes.Equal(dst[1], data[1]) {
			t.Fatalf("beta's prompt %d after alpha went over its quota: %d chunks, %v", i, n, err)
		}
	}
	// alpha's RAM holds eight chunks (its quota, below), its least
	// recently used evicted first: none of its first twelve prompts, all
	// of its last. Which of prompts 16 to 18 lost a chunk depends on the
	// order in which the disk writes, which hold chunks in RAM, finished.
	for i := range 20 {
		tokens, _ := quotaPrompt(alpha, 1, i)
		r, err := alpha.Lookup(ctx, client.Tokens(ha, tokens, 0), 0)
		if err != nil {
			t.Fatal(err)
		}
		inRAM := 0
		if len(r.ByTier) > 0 {
			inRAM = int(r.ByTier[0])
		}
		if i < 12 && inRAM != 0 || i == 19 && inRAM != 2 {
			t.Fatalf("alpha's prompt %d has %d chunks in RAM (by tier %v)", i, inRAM, r.ByTier)
		}
	}
	for _, c := range []struct {
		sample string
		want   func(float64) bool
	}{
		{`kvtier_tenant_quota_limit_bytes{tenant="alpha",tier="mem"}`, func(v float64) bool { return v == 32<<10 }},
		{`kvtier_tenant_quota_used_bytes{tenant="alpha",tier="mem"}`, func(v float64) bool { return v == 32<<10 }},
		{`kvtier_tenant_quota_evictions_total{tenant="alpha",tier="mem"}`, func(v float64) bool { return v == 32 }},
		{`kvtier_tenant_quota_used_bytes{tenant="alpha",tier="disk"}`, func(v float64) bool { return v > 0 && v <= 72<<10 }},
		{`kvtier_tenant_quota_evictions_total{tenant="alpha",tier="disk"}`, func(v float64) bool { return v > 0 }},
		{`kvtier_tenant_chunks{tenant="beta",tier="mem"}`, func(v float64) bool { return v == 6 }},
		{`kvtier_tenant_chunks{tenant="beta",tier="disk"}`, func(v float64) bool { return v == 6 }},
		{`kvtier_tenant_chunks{tenant="alpha",tier="mem"}`, func(v float64) bool { return v == 8 }},
	} {
		if v := metricOf(t, p, c.sample); !c.want(v) {
			t.Errorf("%s = %v", c.sample, v)
		}
	}

	// Lease alpha's eight resident chunks from a full-access local
	// connection: alpha's quota is then full of chunks in use.
	full := mustDial(t, p, true, tTCP)
	hf, err := full.Scope(ctx, alphaScope)
	if err != nil {
		t.Fatal(err)
	}
	var leases []uint64
	for i := 16; i < 20; i++ {
		tokens, _ := quotaPrompt(alpha, 1, i)
		s, err := full.PrepareRetrieve(ctx, client.Tokens(hf, tokens, 0), 60_000)
		if err != nil || len(s.Slots) != 2 {
			t.Fatalf("lease alpha's prompt %d: %+v %v", i, s, err)
		}
		leases = append(leases, s.Lease)
	}
	tokens, data := quotaPrompt(alpha, 1, 20)
	_, err = alpha.Store(ctx, client.Tokens(ha, tokens, 0), data)
	if !client.IsStatus(err, wire.StatusNoSpace) || !strings.Contains(err.Error(), "quota") {
		t.Fatalf("alpha's store with its quota leased: %v, want NO_SPACE naming the quota", err)
	}
	if v := metricOf(t, p, `kvtier_tenant_quota_refused_total{tenant="alpha",tier="mem"}`); v != 1 {
		t.Errorf("refusals counted: %v", v)
	}
	btok, bdata := quotaPrompt(beta, 2, 3)
	if n, err := beta.Store(ctx, client.Tokens(hb, btok, 0), bdata); err != nil || n != 2 {
		t.Fatalf("beta stores while alpha's quota is full: %d %v", n, err)
	}
	for _, l := range leases {
		if err := full.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := alpha.Store(ctx, client.Tokens(ha, tokens, 0), data); err != nil || n != 2 {
		t.Fatalf("alpha stores once the leases are released: %d %v", n, err)
	}
}
