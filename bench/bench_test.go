package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestRunSmallShape runs the whole bench on a small chunk shape and checks
// that every figure was measured and the data round-tripped (Run
// compares the bytes it reads back with the bytes it stored).
func TestRunSmallShape(t *testing.T) {
	f := Options{Layers: 2, Heads: 2, HeadDim: 64, Tokens: 256, DType: "bf16", Chunks: 4, Rounds: 1, Dir: t.TempDir()}
	r, err := Run(context.Background(), f, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if r.ChunkBytes != 2*2*2*64*2*256 {
		t.Fatalf("chunk bytes = %d", r.ChunkBytes)
	}
	for name, v := range map[string]float64{"memcpy": r.MemcpyGBps, "ram store": r.RAMStoreGBps, "ram retrieve": r.RAMRetrieveGBps,
		"raw write": r.RawWriteGBps, "raw read": r.RawReadGBps, "disk write": r.DiskWriteGBps, "disk read": r.DiskReadGBps,
		"lookup": r.LookupMeanMicros, "hash": r.HashNsPerChunk, "vllm": r.VLLMNsPerBlock, "sglang": r.SGLangNsPerPage} {
		if !(v > 0) {
			t.Errorf("%s figure = %v, want a positive measurement", name, v)
		}
	}
	if r.LookupP99Micros < r.LookupMeanMicros/10 {
		t.Errorf("p99 %.1f µs implausibly below mean %.1f µs", r.LookupP99Micros, r.LookupMeanMicros)
	}
	var table bytes.Buffer
	r.Print(&table)
	if d := r.Daemon; d == nil || !(d.P2PRetrieveGBps > 0) || !(d.P2PStreamGBps > 0) || !(d.P2PRetrieveRatio > 0) {
		t.Errorf("P2P figures not measured: %+v", r.Daemon)
	}
	if d := r.Daemon; d == nil || !(d.P2PCtrlRetrieveGBps > 0) || !(d.P2PCtrlRetrieveRatio > 0) {
		t.Errorf("P2P figures through a controller not measured: %+v", r.Daemon)
	}
	if d := r.Daemon; d == nil || !(d.PDPushGBps > 0) || !(d.PDStreamGBps > 0) || !(d.PDPushRatio > 0) {
		t.Errorf("PD figures not measured: %+v", r.Daemon)
	}
	checkLookupRates(t, r.Daemon)
	for _, row := range []string{"RAM tier store", "disk tier read", "local protocol", "TCP protocol", "P2P retrieve", "P2P retrieve via controller", "PD push", "LOOKUP_BATCH"} {
		if !strings.Contains(table.String(), row) {
			t.Errorf("printed report has no %q row:\n%s", row, table.String())
		}
	}
}

func TestRunRejectsBadOptions(t *testing.T) {
	for _, f := range []Options{
		{Layers: 1, Heads: 1, HeadDim: 1, Tokens: 1, DType: "bf17", Chunks: 1, Rounds: 1},
		{Layers: 1, Heads: 1, HeadDim: 1, Tokens: 1, DType: "bf16", Chunks: 0, Rounds: 1},
		{Layers: 0, Heads: 1, HeadDim: 1, Tokens: 1, DType: "bf16", Chunks: 1, Rounds: 1},
	} {
		if _, err := Run(context.Background(), f, &bytes.Buffer{}); err == nil {
			t.Errorf("Run(%+v) accepted bad options", f)
		}
	}
}

// checkLookupRates wants every lookup rate and its baselines measured.
func checkLookupRates(t *testing.T, d *DaemonReport) {
	t.Helper()
	if d == nil {
		t.Fatal("no daemon report")
	}
	for name, v := range map[string]float64{"empty round trips": d.EmptyRoundTrips, "same-bytes round trips": d.SameBytesRoundTrips,
		"pings": d.PingsPerSec, "lookups": d.LookupsPerSec, "batched lookups": d.BatchLookupsPerSec,
		"lookups, request buffer": d.SharedLookupsPerSec, "batched lookups, request buffer": d.SharedBatchLookupsPerSec,
		"lookups, engine hashes": d.HashLookupsPerSec, "batched lookups, engine hashes": d.HashBatchLookupsPerSec,
		"lookups, client hashes": d.ClientHashLookupsPerSec,
		"lookup ratio":           d.LookupRatio, "batch ratio": d.BatchRatio, "p50": d.LookupP50Micros} {
		if !(v > 0) {
			t.Errorf("%s = %v, want a positive measurement", name, v)
		}
	}
}

// TestLookupsOnly measures the lookup rates alone and prints only them.
func TestLookupsOnly(t *testing.T) {
	f := Options{Layers: 2, Heads: 2, HeadDim: 64, Tokens: 256, DType: "bf16", Chunks: 1, Rounds: 1, LookupsOnly: true}
	r, err := Run(context.Background(), f, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	checkLookupRates(t, r.Daemon)
	if r.RAMStoreGBps != 0 || r.Daemon.LocalStoreGBps != 0 {
		t.Error("--lookups-only measured more than lookups")
	}
	var out bytes.Buffer
	r.Print(&out)
	for _, row := range []string{"empty round trips (baseline)", "LOOKUP ", "LOOKUP_BATCH of 16", "request buffer", "LOOKUP, engine hashes (kind 1)", "LOOKUP_BATCH of 16, engine hashes", "hashed by the client"} {
		if !strings.Contains(out.String(), row) {
			t.Errorf("no %q row in:\n%s", row, out.String())
		}
	}
	if strings.Contains(out.String(), "RAM tier") {
		t.Errorf("--lookups-only printed other measurements:\n%s", out.String())
	}
}
