package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/internal/servetest"
)

// dashboard is the part of a Grafana dashboard the checks read.
type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID      int    `json:"id"`
		Type    string `json:"type"`
		Title   string `json:"title"`
		GridPos struct {
			H, W, X, Y int
		} `json:"gridPos"`
		Targets []struct {
			Expr  string `json:"expr"`
			RefID string `json:"refId"`
		} `json:"targets"`
	} `json:"panels"`
}

var (
	promString  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promBraces  = regexp.MustCompile(`\{[^{}]*\}`)
	promRange   = regexp.MustCompile(`\[[^\]]*\]`)
	promGroup   = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent   = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	promKeyword = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}
)

// metricNames returns the metric names a PromQL expression reads: what is
// left once strings, label matchers, ranges, grouping clauses and
// variables are removed, minus function names (followed by "(") and
// keywords.
func metricNames(expr string) []string {
	e := promString.ReplaceAllString(expr, `""`)
	for promBraces.MatchString(e) {
		e = promBraces.ReplaceAllString(e, " ")
	}
	e = promRange.ReplaceAllString(e, " ")
	e = promGroup.ReplaceAllString(e, " ")
	e = regexp.MustCompile(`\$\{?\w+\}?`).ReplaceAllString(e, " ")
	var names []string
	for _, loc := range promIdent.FindAllStringIndex(e, -1) {
		id := e[loc[0]:loc[1]]
		rest := strings.TrimLeft(e[loc[1]:], " \t\n")
		if strings.HasPrefix(rest, "(") || promKeyword[strings.ToLower(id)] {
			continue
		}
		if loc[0] > 0 && (e[loc[0]-1] >= '0' && e[loc[0]-1] <= '9' || e[loc[0]-1] == '.') {
			continue // the exponent of a number such as 1e3
		}
		names = append(names, id)
	}
	return names
}

func TestMetricNames(t *testing.T) {
	for expr, want := range map[string]string{
		`sum by (tier) (rate(kvtier_tier_hits_total{instance=~"$instance",tier="p2p"}[$__rate_interval]))`: "kvtier_tier_hits_total",
		`histogram_quantile(0.99, sum by (op, le) (rate(a_bucket{x="y{z}"}[5m]))) / on(op) b_count`:        "a_bucket b_count",
		`max(x) > bool 1e3 and y offset 5m`:                   "x y",
		`label_values(kvtier_arena_capacity_bytes, instance)`: "kvtier_arena_capacity_bytes instance",
	} {
		if got := strings.Join(metricNames(expr), " "); got != want {
			t.Errorf("%s: got %q, want %q", expr, got, want)
		}
	}
}

// exported scrapes url and returns every name a PromQL query can read
// there: each sample's name, and for histograms and summaries the
// _bucket, _sum and _count series of each family.
func exported(t *testing.T, url string) map[string]bool {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	if resp.StatusCode == http.StatusNotFound {
		return names
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s", url, resp.Status)
	}
	for line := range strings.Lines(string(body)) {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			names[f[2]] = true
			if f[3] == "histogram" || f[3] == "summary" {
				names[f[2]+"_sum"], names[f[2]+"_count"] = true, true
				names[f[2]+"_bucket"] = f[3] == "histogram"
			}
		} else if line != "" && line[0] != '#' {
			names[promIdent.FindString(line)] = true
		}
	}
	return names
}

// TestGrafanaDashboard reads every PromQL expression of the dashboard and
// checks each metric it names is exported by a real `kvtier serve` (RAM,
// disk, a remote tier, a P2P peer, after some requests) or a real
// `kvtier controller`; and that the dashboard covers what it is for: hit
// rates, bytes, latency histograms, evictions, breakers, leases, P2P and
// prefill/decode traffic.
func TestGrafanaDashboard(t *testing.T) {
	var d dashboard
	if err := json.Unmarshal(mustRead(t, "grafana/kvtier.json"), &d); err != nil {
		t.Fatal(err)
	}
	used := map[string][]string{} // metric -> panels
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d repeats", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 || p.GridPos.W == 0 || p.GridPos.H == 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: %d targets, gridPos %+v", p.Title, len(p.Targets), p.GridPos)
		}
		for _, tg := range p.Targets {
			for _, m := range metricNames(tg.Expr) {
				used[m] = append(used[m], p.Title)
			}
		}
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			for _, m := range metricNames(fmt.Sprint(q["query"])) {
				if m != "instance" {
					used[m] = append(used[m], "variable "+v.Name)
				}
			}
		}
	}
	if len(used) < 30 {
		t.Fatalf("only %d metric names found in the dashboard", len(used))
	}

	have := scrapeAll(t)
	var missing []string
	for m, panels := range used {
		if !have[m] {
			missing = append(missing, fmt.Sprintf("%s (in %s)", m, strings.Join(panels, ", ")))
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("the dashboard reads metrics kvtier does not export:\n  %s", strings.Join(missing, "\n  "))
	}
	for _, m := range []string{"kvtier_tier_hits_total", "kvtier_tier_misses_total", "kvtier_tier_used_bytes",
		"kvtier_tier_read_bytes_total", "kvtier_request_seconds_bucket", "kvtier_tier_evictions_total",
		"kvtier_remote_circuit_state", "kvtier_p2p_peer_circuit_state", "kvtier_arena_leases",
		"kvtier_leases_expired_total", "kvtier_pd_pushes_total", "kvtier_pd_held_bytes",
		"kvtier_controller_requests_total", "kvtier_controller_daemons", "kvtier_controller_index_blocks",
		"kvtier_controller_event_messages_total", "kvtier_controller_proxy_inflight"} {
		if used[m] == nil {
			t.Errorf("the dashboard does not show %s", m)
		}
	}
	t.Logf("%d panels, %d metric names, all exported", len(d.Panels), len(used))
}

// scrapeAll starts a daemon with every kind of tier and a controller, makes
// a few requests (so that per-operation series exist), and returns the
// union of what both export.
func scrapeAll(t *testing.T) map[string]bool {
	t.Helper()
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadPeer := ln.Addr().String()
	ln.Close()
	conf := fmt.Sprintf("max_local_cpu_size: 0.0625\nlocal_disk: %s\nmax_local_disk_size: 0.0625\n"+
		"remote_url: fs://%s?capacity=64MiB\np2p_peers: %s\n", filepath.Join(dir, "disk"), filepath.Join(dir, "remote"), deadPeer)
	dm := servetest.Start(t, dir, conf)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.DialUnix(ctx, dm.Sock, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	// A lookup in a scope never registered is answered with an error: it
	// makes kvtier_request_errors_total exist.
	if _, err := c.Lookup(ctx, client.Tokens(12345, make([]uint32, 256), 0), 0); err == nil {
		t.Fatal("lookup in an unregistered scope succeeded")
	}
	// A lookup of a chunk nobody holds asks the P2P peer (which is down),
	// so that the peer's breaker series exist.
	scope, err := c.Scope(ctx, chunk.Scope{Model: "dashboard", WorldSize: 1, Format: "bfloat16/KV_2LTD"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lookup(ctx, client.Tokens(scope, make([]uint32, 256), 0), 0); err != nil {
		t.Fatal(err)
	}
	have := exported(t, dm.Admin+"/metrics")

	bin, err := servetest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	// A pod (nothing listens there) and proxy instances, so that the
	// per-pod and per-instance series exist.
	ctrl := exec.Command(bin, "controller", "--listen", addr, "--hash-seed", "0", "--pod", "p=m=tcp://127.0.0.1:1",
		"--prefill", "p=http://127.0.0.1:1", "--decode", "d=http://127.0.0.1:1=127.0.0.1:1")
	log := &servetest.Log{}
	ctrl.Stderr = log
	if err := ctrl.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { ctrl.Process.Kill(); ctrl.Wait() }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("controller did not answer /healthz: %v\n%s", err, log)
		}
	}
	ctrlNames := exported(t, "http://"+addr+"/metrics")
	t.Logf("daemon exports %d names, controller %d", len(have), len(ctrlNames))
	for m := range ctrlNames {
		have[m] = true
	}
	if !slices.ContainsFunc([]string{"kvtier_tier_hits_total", "kvtier_requests_total"}, func(m string) bool { return have[m] }) {
		t.Fatal("the daemon's /metrics has no kvtier metrics")
	}
	return have
}
