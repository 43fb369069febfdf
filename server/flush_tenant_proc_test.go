package server_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"kvtier/client"
	"kvtier/wire"
)

// TestTenantFlushSeesOnlyItsOwnProcess: a real daemon with a disk tier and
// two tenants. alpha's disk quota (16 KiB) is smaller than each of its
// 64 KiB chunks, so the disk tier refuses every one of them: they are on
// no disk, for good (their RAM quota of 128 KiB also evicts most of them
// from RAM). A FLUSH with alpha's token or the TCP token says so; beta's
// FLUSH, on TCP and on the local socket, is durable and counts none of
// alpha's chunks, and beta's chunks are on disk, byte-exact.
func TestTenantFlushSeesOnlyItsOwnProcess(t *testing.T) {
	const alphaChunks, alphaSize = 8, 64 << 10
	dir := t.TempDir()
	conf := quotaConf(dir, "128KiB", "16KiB")
	p := startProc(t, dir, conf)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	alpha := mustDial(t, p, false, tAlpha)
	ha, err := alpha.Scope(ctx, alphaScope)
	if err != nil {
		t.Fatal(err)
	}
	n := alpha.ChunkTokens()
	for i := range alphaChunks {
		tokens := make([]uint32, n)
		for j := range tokens {
			tokens[j] = uint32(i)<<16 | uint32(j)
		}
		data := bytes.Repeat([]byte{0xa1, byte(i)}, alphaSize/2)
		if got, err := alpha.Store(ctx, client.Tokens(ha, tokens, 0), [][]byte{data}); err != nil || got != 1 {
			t.Fatalf("alpha stores chunk %d: %d %v", i, got, err)
		}
	}
	flush := func(c *client.Client, who string) wire.FlushTier {
		t.Helper()
		rep, err := c.Flush(ctx)
		if err != nil {
			t.Fatalf("%s FLUSH: %v", who, err)
		}
		if len(rep.Tiers) != 1 || rep.Tiers[0].Name != "disk" {
			t.Fatalf("%s FLUSH reply %+v: want the disk tier", who, rep)
		}
		return rep.Tiers[0]
	}
	// Every FLUSH after alpha's stores covers them: each must say so.
	for round := range 2 {
		if r := flush(alpha, "alpha's"); r.Missing != alphaChunks || r.Pending != 0 {
			t.Fatalf("alpha's FLUSH %d: %+v; want its %d chunks missing", round, r, alphaChunks)
		}
	}
	full := mustDial(t, p, false, tTCP)
	if r := flush(full, "the TCP token's"); r.Missing != alphaChunks {
		t.Fatalf("the TCP token's FLUSH: %+v; want alpha's %d chunks missing (daemon-wide)", r, alphaChunks)
	}

	for _, local := range []bool{false, true} {
		beta := mustDial(t, p, local, tBeta)
		hb, err := beta.Scope(ctx, betaScope)
		if err != nil {
			t.Fatal(err)
		}
		salt := byte(10)
		if local {
			salt = 20
		}
		tokens, data := tenantChunks(beta, salt)
		if got, err := beta.Store(ctx, client.Tokens(hb, tokens, 0), data); err != nil || got != 2 {
			t.Fatalf("beta stores (local %v): %d %v", local, got, err)
		}
		r := flush(beta, "beta's")
		if r.Missing != 0 || r.Pending != 0 || r.Redone != 0 {
			t.Fatalf("beta's FLUSH (local %v) reports %+v: alpha's losses leak into it", local, r)
		}
		dst := [][]byte{make([]byte, 4096), make([]byte, 4096)}
		if got, _, err := beta.Retrieve(ctx, client.Tokens(hb, tokens, 0), dst); err != nil || got != 2 ||
			!bytes.Equal(dst[0], data[0]) || !bytes.Equal(dst[1], data[1]) {
			t.Fatalf("beta reads back (local %v): %d %v", local, got, err)
		}
	}
	if r := flush(alpha, "alpha's"); r.Missing != alphaChunks {
		t.Fatalf("alpha's FLUSH after beta's: %+v; want its %d chunks missing", r, alphaChunks)
	}

	// beta's chunks survive a SIGKILL: they were durable on disk.
	p.kill()
	p = startProc(t, dir, conf)
	beta := mustDial(t, p, false, tBeta)
	hb, err := beta.Scope(ctx, betaScope)
	if err != nil {
		t.Fatal(err)
	}
	for _, salt := range []byte{10, 20} {
		tokens, data := tenantChunks(beta, salt)
		dst := [][]byte{make([]byte, 4096), make([]byte, 4096)}
		if got, _, err := beta.Retrieve(ctx, client.Tokens(hb, tokens, 0), dst); err != nil || got != 2 ||
			!bytes.Equal(dst[0], data[0]) || !bytes.Equal(dst[1], data[1]) {
			t.Fatalf("after SIGKILL beta reads back its durable chunks (salt %d): %d %v", salt, got, err)
		}
	}
}
