package admin

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"kvtier/chunk"
	"kvtier/config"
	"kvtier/engine"
	"kvtier/server"
)

const (
	chunkTokens = 16
	chunkBytes  = 4096
	numChunks   = 4
)

var scope = chunk.Scope{Model: "m", WorldSize: 1, Format: "bfloat16/KV_2LTD"}

// fixture is an engine with a RAM and a disk tier, numChunks chunks stored
// in both, and its admin API served on a loopback port.
type fixture struct {
	eng   *engine.Engine
	admin *API
	url   string
}

func newFixture(t testing.TB, cfg config.Config) *fixture {
	t.Helper()
	eng, err := engine.Open(engine.Options{ChunkSize: chunkTokens, RAMBytes: 1 << 20, Policy: "LRU",
		DiskDir: t.TempDir(), DiskBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := eng.Close(); err != nil {
			t.Error(err)
		}
	})
	tokens := make([]uint32, numChunks*chunkTokens)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	chunks := make([][]byte, numChunks)
	for i := range chunks {
		chunks[i] = make([]byte, chunkBytes)
		chunks[i][0] = byte(i)
	}
	ctx := context.Background()
	if n, err := eng.Store(ctx, engine.Request{Scope: scope, Tokens: tokens}, chunks); n != numChunks || err != nil {
		t.Fatalf("stored %d chunks: %v", n, err)
	}
	if err := eng.Manager().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// One lookup that misses, so hit and miss counters are not all zero.
	if _, err := eng.Lookup(engine.Request{Scope: chunk.Scope{Model: "other", WorldSize: 1}, Tokens: tokens}); err != nil {
		t.Fatal(err)
	}
	admin, err := New(eng, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(admin.Handler()) // listens on 127.0.0.1:0
	t.Cleanup(srv.Close)
	return &fixture{eng: eng, admin: admin, url: srv.URL}
}

// do sends a request and returns the status and body.
func do(t *testing.T, method, url, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(data)
}

func TestProbes(t *testing.T) {
	f := newFixture(t, config.Default())
	if resp, body := do(t, "GET", f.url+"/healthz", ""); resp.StatusCode != 200 || body != "ok\n" {
		t.Errorf("/healthz = %d %q", resp.StatusCode, body)
	}
	if resp, _ := do(t, "GET", f.url+"/readyz", ""); resp.StatusCode != 200 {
		t.Errorf("/readyz before drain = %d, want 200", resp.StatusCode)
	}
	f.admin.Drain()
	if resp, _ := do(t, "GET", f.url+"/readyz", ""); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz while draining = %d, want 503", resp.StatusCode)
	}
	if resp, _ := do(t, "GET", f.url+"/healthz", ""); resp.StatusCode != 200 {
		t.Errorf("/healthz while draining = %d, want 200: the process is alive", resp.StatusCode)
	}
}

func TestRouting(t *testing.T) {
	f := newFixture(t, config.Default())
	for _, tc := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{"GET", "/nope", 404, ""},
		{"GET", "/api/v1/nope", 404, ""},
		{"POST", "/healthz", 405, "GET, HEAD"},
		{"DELETE", "/metrics", 405, "GET, HEAD"},
		{"PUT", "/api/v1/stats", 405, "GET, HEAD"},
		{"GET", "/api/v1/clear", 405, "POST"},
		{"HEAD", "/readyz", 200, ""},
	} {
		resp, _ := do(t, tc.method, f.url+tc.path, "")
		if resp.StatusCode != tc.status || resp.Header.Get("Allow") != tc.allow {
			t.Errorf("%s %s = %d Allow %q, want %d Allow %q", tc.method, tc.path,
				resp.StatusCode, resp.Header.Get("Allow"), tc.status, tc.allow)
		}
	}
}

// TestMetricsMatchStats parses the exposition and checks every kvtier
// sample against the manager's own counters.
func TestMetricsMatchStats(t *testing.T) {
	f := newFixture(t, config.Default())
	resp, body := do(t, "GET", f.url+"/metrics", "")
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics = %d", resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("exposition does not parse: %v", err)
	}
	tiers, queues := f.eng.Manager().Stats()
	arenaStats := f.eng.Arena().Stats()
	want := map[string]float64{ // name{tier} → value
		"kvtier_promoted_total":           float64(f.eng.Manager().Promoted()),
		"kvtier_arena_capacity_bytes":     float64(arenaStats.Capacity),
		"kvtier_arena_used_bytes":         float64(arenaStats.Used),
		"kvtier_arena_objects":            float64(arenaStats.Objects),
		"kvtier_arena_largest_free_bytes": float64(arenaStats.LargestFree),
	}
	for _, s := range tiers {
		l := `{tier="` + s.Name + `"}`
		want["kvtier_tier_objects"+l] = float64(s.Objects)
		want["kvtier_tier_used_bytes"+l] = float64(s.Used)
		want["kvtier_tier_capacity_bytes"+l] = float64(s.Capacity)
		want["kvtier_tier_puts_total"+l] = float64(s.Puts)
		want["kvtier_tier_misses_total"+l] = float64(s.Misses)
		want["kvtier_tier_written_bytes_total"+l] = float64(s.BytesWritten)
	}
	for _, q := range queues {
		want[`kvtier_write_queue_capacity{tier="`+q.Tier+`"}`] = float64(q.Capacity)
		want[`kvtier_write_queue_depth{tier="`+q.Tier+`"}`] = float64(q.Depth)
	}
	got := map[string]float64{}
	for name, fam := range families {
		for _, m := range fam.GetMetric() {
			key := name
			for _, lp := range m.GetLabel() {
				key += `{` + lp.GetName() + `="` + lp.GetValue() + `"}`
			}
			switch {
			case m.GetGauge() != nil:
				got[key] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				got[key] = m.GetCounter().GetValue()
			}
		}
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	// The fixture's figures are not zeros, so the comparison means something.
	if got[`kvtier_tier_objects{tier="mem"}`] != numChunks || got[`kvtier_tier_objects{tier="disk"}`] != numChunks {
		t.Errorf("objects: mem %v disk %v, want %d each", got[`kvtier_tier_objects{tier="mem"}`], got[`kvtier_tier_objects{tier="disk"}`], numChunks)
	}
	if _, ok := got["go_goroutines"]; !ok {
		t.Error("the Go runtime metrics are missing")
	}
}

func TestStatsMatchManager(t *testing.T) {
	f := newFixture(t, config.Default())
	resp, body := do(t, "GET", f.url+"/api/v1/stats", "")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("/api/v1/stats = %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var got engine.Stats
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	tiers, queues := f.eng.Manager().Stats()
	var want engine.Stats
	for _, s := range tiers {
		want.Tiers = append(want.Tiers, engine.TierStats{Name: s.Name, CapacityBytes: s.Capacity, UsedBytes: s.Used,
			Objects: s.Objects, PinnedBytes: s.Pinned, Hits: s.Hits, Misses: s.Misses, Puts: s.Puts,
			Evictions: s.Evictions, Removes: s.Removes, Corrupt: s.Corrupt, BytesRead: s.BytesRead,
			BytesWritten: s.BytesWritten})
	}
	for _, q := range queues {
		want.Queues = append(want.Queues, engine.QueueStats{Tier: q.Tier, Depth: q.Depth, Capacity: q.Capacity, Dropped: q.Dropped, Failed: q.Failed})
	}
	// Leases are the engine's, and the fixture holds none.
	a := f.eng.Arena().Stats()
	want.Arena = engine.ArenaStats{CapacityBytes: a.Capacity, UsedBytes: a.Used, PinnedBytes: a.Pinned,
		Objects: a.Objects, FreeRuns: a.FreeRuns, LargestFreeBytes: a.LargestFree}
	want.Promoted = f.eng.Manager().Promoted()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("stats:\n got %+v\nwant %+v", got, want)
	}
	if len(got.Tiers) != 2 || got.Tiers[0].Name != "mem" || got.Tiers[1].Name != "disk" || got.Tiers[1].Objects != numChunks {
		t.Errorf("want mem then disk holding %d chunks, got %+v", numChunks, got.Tiers)
	}
	for _, name := range []string{`"capacity_bytes"`, `"bytes_written"`, `"largest_free_bytes"`, `"dropped"`} {
		if !strings.Contains(body, name) {
			t.Errorf("body lacks %s", name)
		}
	}
}

func TestConfigHidesSecretsAndKeepsKeyNames(t *testing.T) {
	cfg := config.Default()
	cfg.RemoteURL = "redis://app:hunter2@cache:6379/0"
	cfg.ExtraConfig = map[string]any{"api_token": "s3cr3t", "pool": 4}
	f := newFixture(t, cfg)
	resp, body := do(t, "GET", f.url+"/api/v1/config", "")
	if resp.StatusCode != 200 {
		t.Fatalf("/api/v1/config = %d %s", resp.StatusCode, body)
	}
	if strings.Contains(body, "hunter2") || strings.Contains(body, "s3cr3t") {
		t.Fatalf("a secret leaked:\n%s", body)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	if got["remote_url"] != "redis://app:REDACTED@cache:6379/0" || got["write_wait"] != "5ms" ||
		got["disk_segment_size"] != "256MiB" || got["admin_addr"] != "127.0.0.1:7480" || got["chunk_size"] != 256.0 {
		t.Errorf("config rendered wrong:\n%s", body)
	}
	// Keys appear in the documented order.
	re := regexp.MustCompile(`(?m)^  "([a-z0-9_]+)":`)
	var order []string
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		order = append(order, m[1])
	}
	if !slices.Equal(order, config.Keys()) {
		t.Errorf("key order %v, want %v", order, config.Keys())
	}
}

func TestClearEmptiesRAMOfTheScope(t *testing.T) {
	f := newFixture(t, config.Default())
	ramObjects := func() int64 { return f.eng.Manager().RAM().Stats().Objects }

	resp, body := do(t, "POST", f.url+"/api/v1/clear", `{"scope": 12345}`)
	var res ClearResult
	if err := json.Unmarshal([]byte(body), &res); resp.StatusCode != 200 || err != nil {
		t.Fatalf("clear of another scope = %d %s (%v)", resp.StatusCode, body, err)
	}
	if res.Removed["mem"] != 0 || ramObjects() != numChunks {
		t.Errorf("clearing another scope removed %v; RAM holds %d", res.Removed, ramObjects())
	}

	resp, body = do(t, "POST", f.url+"/api/v1/clear", `{"scope": "0x`+strconv.FormatUint(scope.ID(), 16)+`"}`)
	res = ClearResult{}
	if err := json.Unmarshal([]byte(body), &res); resp.StatusCode != 200 || err != nil {
		t.Fatalf("clear = %d %s (%v)", resp.StatusCode, body, err)
	}
	if res.Scope != scope.ID() || res.Removed["mem"] != numChunks || ramObjects() != 0 {
		t.Errorf("clear = %+v; RAM holds %d, want 0", res, ramObjects())
	}
	// The disk tier is cleared too, and nothing is reported as kept.
	if len(res.NotCleared) != 0 || res.Note != "" || res.Removed["disk"] != numChunks {
		t.Errorf("the disk tier should be cleared: %+v", res)
	}
	if st, _ := f.eng.Manager().Stats(); st[1].Objects != 0 {
		t.Errorf("disk holds %d chunks after the clear, want 0", st[1].Objects)
	}
}

func TestClearWithoutBodyClearsEverything(t *testing.T) {
	f := newFixture(t, config.Default())
	resp, body := do(t, "POST", f.url+"/api/v1/clear", "")
	if resp.StatusCode != 200 || !strings.Contains(body, `"mem": 4`) {
		t.Errorf("clear = %d %s", resp.StatusCode, body)
	}
	if n := f.eng.Manager().RAM().Stats().Objects; n != 0 {
		t.Errorf("RAM holds %d chunks after clearing all", n)
	}
}

func TestClearRefusesBadBodies(t *testing.T) {
	f := newFixture(t, config.Default())
	for body, status := range map[string]int{
		`{"scope": -1}`:                     400,
		`{"scope": 1.5}`:                    400,
		`{"scope": "18446744073709551616"}`: 400,
		`{"scop": 1}`:                       400,
		`{"scope": 1} {"scope": 2}`:         400,
		`[1]`:                               400,
		`{"scope": 1`:                       400,
		`{"scope": "` + strings.Repeat("1", maxClearBody) + `"}`: 413,
	} {
		resp, got := do(t, "POST", f.url+"/api/v1/clear", body)
		if resp.StatusCode != status || !strings.Contains(got, `"error"`) {
			t.Errorf("%.40s: %d %s, want %d with an error", body, resp.StatusCode, got, status)
		}
	}
	if n := f.eng.Manager().RAM().Stats().Objects; n != numChunks {
		t.Errorf("a refused clear removed chunks: RAM holds %d", n)
	}
}

// TestDocsListEveryMetric keeps docs/metrics.md true in both directions.
func TestDocsListEveryMetric(t *testing.T) {
	const path = "../docs/metrics.md"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	ch := make(chan *prometheus.Desc, 64)
	newCollector(nil).Describe(ch)
	newTenantCollector(nil, nil).Describe(ch)
	svc := server.NewService(nil, server.ServiceOptions{})
	defer svc.Shutdown(context.Background())
	for _, c := range svc.Collectors() {
		c.Describe(ch)
	}
	close(ch)
	names := map[string]bool{}
	for d := range ch {
		name := regexp.MustCompile(`fqName: "([^"]+)"`).FindStringSubmatch(d.String())[1]
		names[name] = true
		if !strings.Contains(doc, "| `"+name+"` |") {
			t.Errorf("%s is not in the table of %s", name, path)
		}
	}
	for _, m := range regexp.MustCompile("`(kvtier_[a-z_]+)`").FindAllStringSubmatch(doc, -1) {
		if !names[m[1]] {
			t.Errorf("%s documents %s, which is not exported", path, m[1])
		}
	}
}

// TestConfigThatCannotBeJSONIsAnError: YAML allows mapping keys JSON does
// not; the endpoint reports that rather than dropping or leaking entries.
func TestConfigThatCannotBeJSONIsAnError(t *testing.T) {
	cfg := config.Default()
	cfg.ExtraConfig = map[string]any{"ports": map[any]any{1: "a"}}
	f := newFixture(t, cfg)
	resp, body := do(t, "GET", f.url+"/api/v1/config", "")
	if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(body, "extra_config") {
		t.Errorf("/api/v1/config = %d %s, want 500 naming extra_config", resp.StatusCode, body)
	}
}

// TestDashboardIsServed: the admin server serves the dashboard at / and
// /dashboard/ with its assets, and unknown paths still answer 404.
func TestDashboardIsServed(t *testing.T) {
	f := newFixture(t, config.Default())
	for path, want := range map[string]string{"/": "text/html", "/dashboard/": "text/html", "/app.js": "javascript", "/dashboard/style.css": "text/css"} {
		resp, body := do(t, "GET", f.url+path, "")
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), want) || len(body) == 0 {
			t.Errorf("GET %s: %d %q (%d bytes)", path, resp.StatusCode, resp.Header.Get("Content-Type"), len(body))
		}
	}
	for _, path := range []string{"/nope", "/api/v1/nope", "/dashboard/nope.js"} {
		if resp, _ := do(t, "GET", f.url+path, ""); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, resp.StatusCode)
		}
	}
	if resp, _ := do(t, "GET", f.url+"/healthz", ""); resp.StatusCode != 200 {
		t.Errorf("/healthz shadowed by the dashboard: %d", resp.StatusCode)
	}
}
