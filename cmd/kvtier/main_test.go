package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvtier/internal/citest"
	"kvtier/replay"
)

// TestReplayRealTracePrefix replays the first requests of the bundled trace
// through the engine (RAM and disk tiers) and checks the report against
// the simulation: no policy beats OPT, OPT does not beat the infinite
// cache, and the engine's LRU run matches the simulated LRU exactly when
// the disk tier is off (same capacity in blocks, same policy code).
func TestReplayRealTracePrefix(t *testing.T) {
	trace := citest.Shared(t, "traces", "conversation_trace.jsonl")
	for _, disk := range []float64{0, 0.3} {
		var out bytes.Buffer
		plot := filepath.Join(t.TempDir(), "chart.svg")
		f := replayFlags{trace: trace, policy: "LRU", ramFrac: 0.1, diskFrac: disk, bytesPerToken: 8, requests: 400,
			plot: plot, sweep: "5,10,20", json: true, noProgress: true}
		if err := runReplay(context.Background(), f, &out, &bytes.Buffer{}); err != nil {
			t.Fatal(err)
		}
		var r replayReport
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		sim := map[string]float64{}
		for _, s := range r.Simulated {
			sim[s.Policy] = s.HitRate
		}
		for p, h := range sim {
			if p != "INFINITE" && h > sim["OPT"]+1e-12 {
				t.Errorf("%s %.4f beats OPT %.4f", p, h, sim["OPT"])
			}
		}
		if sim["OPT"] > sim["INFINITE"]+1e-12 || sim["OPT"] == 0 {
			t.Errorf("OPT %.4f vs infinite %.4f", sim["OPT"], sim["INFINITE"])
		}
		t.Logf("disk %.1f: engine LRU %.4f, simulated LRU %.4f, OPT %.4f", disk, r.BlockHitRate, sim["LRU"], sim["OPT"])
		if r.Requests != 400 || r.BlockHitRate <= 0 {
			t.Errorf("report: %+v", r)
		}
		// 8 B/token makes a block exactly one arena page, so the engine's
		// RAM holds exactly RAMBlocks blocks, as the simulation does.
		if d := r.BlockHitRate - sim["LRU"]; disk == 0 && (d > 0.001 || d < -0.001) {
			t.Errorf("engine LRU without disk %.4f differs from simulated LRU %.4f", r.BlockHitRate, sim["LRU"])
		}
		if disk > 0 && (r.DiskWritten == 0 || r.DiskTokenRate <= 0) {
			t.Errorf("disk tier unused: written %d, disk token rate %.4f", r.DiskWritten, r.DiskTokenRate)
		}
		svg, err := os.ReadFile(plot)
		if err != nil || !strings.Contains(string(svg), "OPT") {
			t.Errorf("chart missing or without OPT: %v", err)
		}
	}
}

func TestReplayBadTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.jsonl")
	os.WriteFile(path, []byte("{\"timestamp\": 0, \"input_length\": \"x\"}\n"), 0o644)
	f := replayFlags{trace: path, policy: "LRU", ramFrac: 0.1, bytesPerToken: 8, noProgress: true}
	if err := runReplay(context.Background(), f, &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "bad.jsonl") {
		t.Fatalf("bad trace error = %v, want one naming the file", err)
	}
	f.trace = filepath.Join(t.TempDir(), "missing.jsonl")
	if err := runReplay(context.Background(), f, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
		t.Fatal("missing trace accepted")
	}
}

// TestReplayNodesRealTrace simulates the bundled trace over four nodes
// and checks the report: both table and JSON print, every routing runs
// without and with P2P, the sources add up, and peers serve only with P2P.
func TestReplayNodesRealTrace(t *testing.T) {
	trace := citest.Shared(t, "traces", "conversation_trace.jsonl")
	f := replayFlags{trace: trace, policy: "LRU", ramFrac: 0.01, diskFrac: 0.03, requests: 2000, noProgress: true,
		nodes:  nodesFlags{nodes: 4, remote: 0.1, scorer: "longest-prefix"},
		router: routerFlags{prefillRate: 10_000, decodeRate: 50, loadWeight: 0.05}}
	var out bytes.Buffer
	if err := runNodesReplay(context.Background(), f, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())
	for _, want := range []string{"local RAM", "peer", "remote", "miss", "round-robin", "kvtier+load"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q", want)
		}
	}
	f.json = true
	out.Reset()
	if err := runNodesReplay(context.Background(), f, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	var r nodesReport
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	if r.Requests != 2000 || len(r.Results) != 6 {
		t.Fatalf("report: %d requests, %d results, want 2000 and 6", r.Requests, len(r.Results))
	}
	for _, x := range r.Results {
		sum := 0.0
		for _, v := range x.Fractions {
			sum += v
		}
		if sum < 1-1e-9 || sum > 1+1e-9 {
			t.Errorf("%s P2P %v: fractions sum to %v", x.Routing, x.P2P, sum)
		}
		peer := x.ByTier[replay.SourcePeer]
		if !x.P2P && peer != 0 || x.P2P && x.Routing == replay.RouteRoundRobin && peer == 0 {
			t.Errorf("%s P2P %v: %d peer tokens", x.Routing, x.P2P, peer)
		}
	}
}

func TestReplayNodesBadFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.jsonl")
	os.WriteFile(path, []byte("{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n"), 0o644)
	f := replayFlags{trace: path, policy: "LRU", ramFrac: 0.5, noProgress: true, nodes: nodesFlags{nodes: 2, scorer: "nope"}}
	if err := runNodesReplay(context.Background(), f, &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("unknown scorer: %v", err)
	}
}
