package server_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"kvtier/client"
)

// TestTenantQuotaAfterRestartProcess: a real daemon with RAM and disk
// tiers and a disk quota for alpha. alpha stores eight chunks within its
// quota and beta six, made durable with FLUSH; the daemon is killed and
// restarted on its directory. The recovered records are charged to alpha
// as soon as a client opens alpha's scope again (the quota metric shows
// the same bytes as before the kill), so alpha's next sixteen chunks evict
// its own records, old ones included, to stay within the quota, instead
// of adding a second quota's worth on top of the first. beta's chunks all
// stay, byte-exact.
func TestTenantQuotaAfterRestartProcess(t *testing.T) {
	dir := t.TempDir()
	conf := quotaConf(dir, "32KiB", "72KiB")
	const (
		diskUsed   = `kvtier_tenant_quota_used_bytes{tenant="alpha",tier="disk"}`
		diskEvict  = `kvtier_tenant_quota_evictions_total{tenant="alpha",tier="disk"}`
		alphaDisk  = `kvtier_tenant_chunks{tenant="alpha",tier="disk"}`
		betaDisk   = `kvtier_tenant_chunks{tenant="beta",tier="disk"}`
		quotaBytes = 72 << 10
	)
	p := startProc(t, dir, conf)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store := func(c *client.Client, h uint32, salt byte, prompts ...int) {
		t.Helper()
		for _, i := range prompts {
			tokens, data := quotaPrompt(c, salt, i)
			if n, err := c.Store(ctx, client.Tokens(h, tokens, 0), data); err != nil || n != 2 {
				t.Fatalf("store prompt %d (salt %d): %d %v", i, salt, n, err)
			}
		}
	}
	alpha, beta := mustDial(t, p, false, tAlpha), mustDial(t, p, false, tBeta)
	ha, err := alpha.Scope(ctx, alphaScope)
	if err != nil {
		t.Fatal(err)
	}
	hb, err := beta.Scope(ctx, betaScope)
	if err != nil {
		t.Fatal(err)
	}
	store(beta, hb, 2, 0, 1, 2)
	store(alpha, ha, 1, 0, 1, 2, 3)
	if rep, err := mustDial(t, p, false, tTCP).Flush(ctx); err != nil || !rep.Durable() {
		t.Fatalf("FLUSH: %+v %v", rep, err)
	}
	before := metricOf(t, p, diskUsed)
	if before <= 0 || before > quotaBytes || metricOf(t, p, diskEvict) != 0 || metricOf(t, p, alphaDisk) != 8 {
		t.Fatalf("before the kill alpha's disk quota uses %v bytes (%v evictions, %v chunks); want 8 chunks within %d, none evicted",
			before, metricOf(t, p, diskEvict), metricOf(t, p, alphaDisk), quotaBytes)
	}
	per := before / 8 // bytes on disk per chunk, header and padding included
	p.kill()

	p = startProc(t, dir, conf)
	if v := metricOf(t, p, diskUsed); v != 0 {
		t.Fatalf("before alpha's scope is opened again its disk quota uses %v bytes", v)
	}
	alpha, beta = mustDial(t, p, false, tAlpha), mustDial(t, p, false, tBeta)
	if ha, err = alpha.Scope(ctx, alphaScope); err != nil {
		t.Fatal(err)
	}
	if v := metricOf(t, p, diskUsed); v != before {
		t.Fatalf("alpha's recovered records are charged %v bytes; want the %v charged before the restart", v, before)
	}
	store(alpha, ha, 1, 10, 11, 12, 13, 14, 15, 16, 17)
	if rep, err := mustDial(t, p, false, tTCP).Flush(ctx); err != nil || !rep.Durable() {
		t.Fatalf("FLUSH after the restart: %+v %v", rep, err)
	}
	used, chunks := metricOf(t, p, diskUsed), metricOf(t, p, alphaDisk)
	if used > quotaBytes || chunks*per > quotaBytes || metricOf(t, p, diskEvict) == 0 {
		t.Fatalf("after 16 more chunks alpha holds %v chunks on disk, %v bytes charged, %v evicted; quota %d bytes, %v per chunk",
			chunks, used, metricOf(t, p, diskEvict), quotaBytes, per)
	}
	// alpha's oldest records made room: prompt 0 is gone from disk, and
	// whatever alpha still reads back is byte-exact.
	dst := [][]byte{make([]byte, quotaChunk), make([]byte, quotaChunk)}
	for _, i := range []int{0, 1, 2, 3, 17} {
		tokens, data := quotaPrompt(alpha, 1, i)
		n, _, err := alpha.Retrieve(ctx, client.Tokens(ha, tokens, 0), dst)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 && n != 0 || i == 17 && n != 2 {
			t.Errorf("alpha's prompt %d: %d chunks read back", i, n)
		}
		for j := range int(n) {
			if !bytes.Equal(dst[j], data[j]) {
				t.Fatalf("alpha's prompt %d chunk %d came back with other bytes", i, j)
			}
		}
	}
	if hb, err = beta.Scope(ctx, betaScope); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		tokens, data := quotaPrompt(beta, 2, i)
		n, _, err := beta.Retrieve(ctx, client.Tokens(hb, tokens, 0), dst)
		if err != nil || n != 2 || !bytes.Equal(dst[0], data[0]) || !bytes.Equal(dst[1], data[1]) {
			t.Fatalf("beta's prompt %d after alpha's stores: %d chunks, %v", i, n, err)
		}
	}
	if v := metricOf(t, p, betaDisk); v != 6 {
		t.Errorf("beta has %v chunks on disk, want 6", v)
	}
}
