package dashboard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"kvtier/admin"
	"kvtier/admin/dashboard"
	"kvtier/chunk"
	"kvtier/config"
	"kvtier/engine"
)

// The browser test runs the real page in headless Chromium against a real
// engine and admin API, then checks that every number of GET
// /api/v1/stats appears in the rendered page, exactly, and that the
// script ran without an error.

const (
	testChunkTokens = 256
	testChunkBytes  = 64 << 10
	testChunks      = 8
)

// findChromium returns the browser's path. Without one the test is
// skipped locally, but fails in CI, where .ci/run installs it.
func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed; the dashboard's browser test needs it in CI")
	}
	t.Skip("chromium is not installed")
	return ""
}

// newDaemon opens an engine with a RAM and a disk tier, gives every
// counter something to count, and serves the admin API beside the
// dashboard, which is mounted both at "/" and at "/dashboard/".
func newDaemon(t *testing.T) string {
	t.Helper()
	eng, err := engine.Open(engine.Options{ChunkSize: testChunkTokens, RAMBytes: 64 << 20, Policy: "LRU",
		DiskDir: t.TempDir(), DiskBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := eng.Close(); err != nil {
			t.Error(err)
		}
	})
	exercise(t, eng)

	adm, err := admin.New(eng, config.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/api/", adm.Handler())
	mux.Handle("/", dashboard.Handler())
	mux.Handle("/dashboard/", dashboard.Handler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// exercise stores chunks (RAM and disk writes), reads them back (RAM
// hits), drops them from RAM and reads again (disk hits, promotions),
// and asks for a prompt never stored (misses).
func exercise(t *testing.T, eng *engine.Engine) {
	t.Helper()
	ctx := context.Background()
	scope := chunk.Scope{Model: "m", WorldSize: 1, Format: "bfloat16/KV_2LTD"}
	tokens := make([]uint32, testChunks*testChunkTokens)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	chunks := make([][]byte, testChunks)
	for i := range chunks {
		chunks[i] = bytes.Repeat([]byte{byte(i)}, testChunkBytes)
	}
	req := engine.Request{Scope: scope, Tokens: tokens}
	if n, err := eng.Store(ctx, req, chunks); n != testChunks || err != nil {
		t.Fatalf("stored %d of %d chunks: %v", n, testChunks, err)
	}
	if err := eng.Manager().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	retrieve := func(r engine.Request, want int) {
		t.Helper()
		dst := make([][]byte, testChunks)
		for i := range dst {
			dst[i] = make([]byte, testChunkBytes)
		}
		got, err := eng.Retrieve(ctx, r, dst)
		if err != nil || got.Chunks != want {
			t.Fatalf("retrieved %d chunks, want %d: %v", got.Chunks, want, err)
		}
	}
	retrieve(req, testChunks)
	if n := eng.Manager().RAM().Clear(0); n != testChunks {
		t.Fatalf("cleared %d chunks from RAM, want %d", n, testChunks)
	}
	retrieve(engine.Request{Scope: scope, Tokens: tokens[:testChunks/2*testChunkTokens]}, testChunks/2)
	other := scope
	other.Model = "other"
	retrieve(engine.Request{Scope: other, Tokens: tokens}, 0)
}

// getStats returns GET /api/v1/stats twice decoded: as the server's type,
// and generically, with numbers kept as their exact JSON text.
func getStats(t *testing.T, base string) (engine.Stats, map[string]any) {
	t.Helper()
	res, err := http.Get(base + "/api/v1/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET /api/v1/stats: %d %v", res.StatusCode, err)
	}
	var typed engine.Stats
	if err := json.Unmarshal(body, &typed); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var generic map[string]any
	if err := dec.Decode(&generic); err != nil {
		t.Fatal(err)
	}
	return typed, generic
}

func TestBrowserRendersStats(t *testing.T) {
	browser := findChromium(t)
	base := newDaemon(t)
	typed, generic := getStats(t, base)
	if typed.Tiers[0].Hits == 0 || typed.Tiers[1].Hits == 0 || typed.Tiers[0].Misses == 0 || typed.Promoted == 0 {
		t.Fatalf("the fixture should have counted hits, misses and promotions: %+v", typed)
	}

	for _, mount := range []string{"/", "/dashboard/"} {
		t.Run(strings.Trim(mount, "/")+"root", func(t *testing.T) {
			page := renderInBrowser(t, browser, base+mount)
			checkRendered(t, page, typed, generic)
		})
	}

	// Nothing changed while the browser read: the page had the figures
	// fetched above to show, and no others.
	if after, _ := getStats(t, base); !reflect.DeepEqual(after, typed) {
		t.Fatalf("stats changed while the browser loaded the page:\nbefore %+v\nafter  %+v", typed, after)
	}
}

// renderInBrowser loads url in headless Chromium, lets the page poll for
// a few seconds of virtual time, and returns the DOM it ended with. The
// browser's console goes to stderr, where an uncaught error or a refused
// resource fails the test.
func renderInBrowser(t *testing.T, browser, url string) *node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu",
		"--disable-background-networking", "--disable-extensions", "--no-first-run",
		"--disable-dev-shm-usage", "--user-data-dir="+t.TempDir(),
		"--enable-logging=stderr", "--v=0",
		"--virtual-time-budget=4000", "--dump-dom", url)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", browser, err, stderr.String())
	}
	for _, bad := range []string{"Uncaught", "Refused to", "Content Security Policy", "kvtier dashboard:"} {
		if strings.Contains(stderr.String(), bad) {
			t.Fatalf("browser console reports %q:\n%s", bad, stderr.String())
		}
	}
	doc, err := parseHTML(stdout.Bytes())
	if err != nil {
		t.Fatalf("parsing the DOM Chromium dumped: %v\n%s", err, stdout.String())
	}
	return doc
}

func checkRendered(t *testing.T, doc *node, typed engine.Stats, generic map[string]any) {
	t.Helper()
	html := doc.find(func(n *node) bool { return n.name == "html" })
	if html == nil || html.attr["data-ok"] != "true" || html.attr["data-error"] != "" {
		t.Fatalf("page did not render cleanly: html attributes %v", html.attrs())
	}
	if polls, _ := strconv.Atoi(html.attr["data-polls"]); polls < 2 {
		t.Fatalf("page rendered %d polls, want at least 2 for rates", polls)
	}
	if status := doc.byID("status"); status == nil || status.attr["data-state"] != "ok" {
		t.Fatalf("status: %+v", status)
	}

	// Every figure of the API, exactly.
	for _, tierAny := range generic["tiers"].([]any) {
		fields := tierAny.(map[string]any)
		name := fields["name"].(string)
		checkFields(t, doc, "data-tier", name, fields, "name")
	}
	for _, queueAny := range generic["queues"].([]any) {
		fields := queueAny.(map[string]any)
		checkFields(t, doc, "data-queue", fields["tier"].(string), fields, "tier")
	}
	checkFields(t, doc, "data-group", "arena", generic["arena"].(map[string]any))
	checkNumber(t, doc.field("data-group", "overall", "promoted"), generic["promoted"].(json.Number).String())

	// Figures the page derives.
	for _, tr := range typed.Tiers {
		checkRatio(t, doc.field("data-tier", tr.Name, "hit_rate"), tr.Hits, tr.Misses)
		checkRatio(t, doc.field("data-tier", tr.Name, "used_ratio"), uint64(tr.UsedBytes), uint64(tr.CapacityBytes-tr.UsedBytes))
	}
	// Overall: hits of every tier out of the reads RAM saw.
	var served uint64
	for _, tr := range typed.Tiers {
		served += tr.Hits
	}
	reads := typed.Tiers[0].Hits + typed.Tiers[0].Misses
	if served > reads {
		t.Fatalf("fixture: %d chunks served of %d reads", served, reads)
	}
	checkNumber(t, doc.field("data-group", "overall", "served"), strconv.FormatUint(served, 10))
	checkNumber(t, doc.field("data-group", "overall", "reads"), strconv.FormatUint(reads, 10))
	checkRatio(t, doc.field("data-group", "overall", "hit_rate"), served, reads-served)

	// The charts: one series per tier (and the overall hit rate). The
	// stats did not move between polls, so throughput is zero and a hit
	// rate of no reads is no value at all.
	names := []string{}
	for _, tr := range typed.Tiers {
		names = append(names, tr.Name)
	}
	for chart, want := range map[string]string{"chart-hit-rate": "", "chart-read": "0", "chart-write": "0"} {
		fig := doc.byID(chart)
		if fig == nil {
			t.Fatalf("no #%s", chart)
		}
		wantSeries := names
		if chart == "chart-hit-rate" {
			wantSeries = append([]string{"all tiers"}, names...)
		}
		var got []string
		for _, li := range fig.findAll(func(n *node) bool { return n.name == "li" }) {
			got = append(got, li.attr["data-series"])
			latest := li.find(func(n *node) bool { return n.attr["data-field"] == "latest" })
			if latest == nil || latest.attr["data-value"] != want {
				t.Errorf("#%s series %s: latest value %v, want %q", chart, li.attr["data-series"], latest.attrs(), want)
			}
		}
		if !reflect.DeepEqual(got, wantSeries) {
			t.Errorf("#%s legend %v, want %v", chart, got, wantSeries)
		}
	}
}

// checkFields checks that every number in fields is shown in the element
// marked groupAttr=group data-field=key, except the skipped keys.
func checkFields(t *testing.T, doc *node, groupAttr, group string, fields map[string]any, skip ...string) {
	t.Helper()
	for key, v := range fields {
		if contains(skip, key) {
			continue
		}
		num, ok := v.(json.Number)
		if !ok {
			t.Fatalf("%s=%s: field %s is %T, not a number", groupAttr, group, key, v)
		}
		el := doc.field(groupAttr, group, key)
		if el == nil {
			t.Errorf("%s=%q: no element shows %s", groupAttr, group, key)
			continue
		}
		checkNumber(t, el, num.String())
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// checkNumber checks the element's exact value and that its text shows
// the same number in the element's format.
func checkNumber(t *testing.T, el *node, want string) {
	t.Helper()
	if el == nil {
		t.Errorf("no element for value %s", want)
		return
	}
	if el.attr["data-value"] != want {
		t.Errorf("%v: data-value %q, want %q", el.attrs(), el.attr["data-value"], want)
		return
	}
	n, _ := strconv.ParseFloat(want, 64)
	text := strings.TrimSpace(el.text.String())
	switch el.attr["data-format"] {
	case "count":
		if strings.ReplaceAll(text, ",", "") != want {
			t.Errorf("%v: shows %q for count %s", el.attrs(), text, want)
		}
	case "bytes":
		shown, err := parseBytes(text)
		// One decimal of the unit: within 0.05 units, relative 5% at worst.
		if err != nil || math.Abs(shown-n) > 0.05*math.Max(1, unitOf(n)) {
			t.Errorf("%v: shows %q for %s bytes (%v)", el.attrs(), text, want, err)
		}
	default:
		t.Errorf("%v: unexpected format", el.attrs())
	}
}

// checkRatio checks an element that shows part/(part+rest) as a percentage.
func checkRatio(t *testing.T, el *node, part, rest uint64) {
	t.Helper()
	if el == nil {
		t.Errorf("no element for ratio %d/%d", part, part+rest)
		return
	}
	want := float64(part) / float64(part+rest)
	got, err := strconv.ParseFloat(el.attr["data-value"], 64)
	if err != nil || math.Abs(got-want) > 1e-12 {
		t.Errorf("%v: ratio %q, want %v", el.attrs(), el.attr["data-value"], want)
	}
	if text, wantText := strings.TrimSpace(el.text.String()), fmt.Sprintf("%.1f%%", 100*want); text != wantText {
		t.Errorf("%v: shows %q, want %q", el.attrs(), text, wantText)
	}
}

var bytesText = regexp.MustCompile(`^(-?[0-9.]+) (B|KiB|MiB|GiB|TiB)$`)

func parseBytes(s string) (float64, error) {
	m := bytesText.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("%q is not a byte size", s)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	exp := map[string]float64{"B": 0, "KiB": 1, "MiB": 2, "GiB": 3, "TiB": 4}[m[2]]
	return v * math.Pow(1024, exp), err
}

// unitOf is the binary unit a size is shown in.
func unitOf(n float64) float64 {
	u := 1.0
	for n >= 1024*u {
		u *= 1024
	}
	return u
}

// node is one element of a parsed page: enough of a DOM to find elements
// by attribute and read their text.
type node struct {
	name     string
	attr     map[string]string
	text     strings.Builder // all text below the element
	children []*node
}

func (n *node) attrs() map[string]string {
	if n == nil {
		return nil
	}
	return n.attr
}

// parseHTML reads Chromium's serialized DOM with encoding/xml in its
// lenient HTML mode, which the markup of this page (no inline script,
// void elements only from the HTML list) stays within.
func parseHTML(page []byte) (*node, error) {
	dec := xml.NewDecoder(bytes.NewReader(page))
	dec.Strict = false
	dec.AutoClose = xml.HTMLAutoClose
	dec.Entity = xml.HTMLEntity
	root := &node{name: "#document", attr: map[string]string{}}
	stack := []*node{root}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return root, nil
		}
		if err != nil {
			return nil, err
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			n := &node{name: strings.ToLower(tok.Name.Local), attr: map[string]string{}}
			for _, a := range tok.Attr {
				n.attr[a.Name.Local] = a.Value
			}
			top := stack[len(stack)-1]
			top.children = append(top.children, n)
			stack = append(stack, n)
		case xml.EndElement:
			if len(stack) > 1 {
				stack = stack[:len(stack)-1]
			}
		case xml.CharData:
			for _, n := range stack {
				n.text.Write(tok)
			}
		}
	}
}

func (n *node) findAll(match func(*node) bool) []*node {
	var out []*node
	var walk func(*node)
	walk = func(n *node) {
		for _, c := range n.children {
			if match(c) {
				out = append(out, c)
			}
			walk(c)
		}
	}
	walk(n)
	return out
}

func (n *node) find(match func(*node) bool) *node {
	if all := n.findAll(match); len(all) > 0 {
		return all[0]
	}
	return nil
}

func (n *node) byID(id string) *node {
	return n.find(func(c *node) bool { return c.attr["id"] == id })
}

// field finds the element showing one figure. The templates' elements
// carry no group attribute, so they never match.
func (n *node) field(groupAttr, group, key string) *node {
	return n.find(func(c *node) bool { return c.attr[groupAttr] == group && c.attr["data-field"] == key })
}

// TestBrowserChartsRatesFromDeltas points the page, through its api
// parameter, at a stats endpoint whose counters grow by a fixed step on
// every call, and checks the rates the charts derive from the deltas.
func TestBrowserChartsRatesFromDeltas(t *testing.T) {
	browser := findChromium(t)
	var calls atomic.Int64
	stats := func(k uint64) engine.Stats {
		return engine.Stats{
			Tiers: []engine.TierStats{
				{Name: "mem", CapacityBytes: 1 << 30, Hits: 30 * k, Misses: 10 * k, BytesRead: 0, BytesWritten: 4096 * k},
				{Name: "disk", CapacityBytes: 1 << 30, Hits: 5 * k, BytesRead: 8192 * k},
			},
			Queues: []engine.QueueStats{{Tier: "disk", Capacity: 64}},
			Arena:  engine.ArenaStats{CapacityBytes: 1 << 30},
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/", dashboard.Handler())
	mux.HandleFunc("GET /scripted/stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(stats(uint64(calls.Add(1))))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	doc := renderInBrowser(t, browser, srv.URL+"/?api=scripted/stats&interval=500")
	if html := doc.find(func(n *node) bool { return n.name == "html" }); html.attr["data-ok"] != "true" {
		t.Fatalf("page did not render: %v", html.attrs())
	}
	latest := func(chart, series string) string {
		li := doc.byID(chart).find(func(n *node) bool { return n.name == "li" && n.attr["data-series"] == series })
		if li == nil {
			t.Fatalf("#%s has no series %s", chart, series)
		}
		return li.find(func(n *node) bool { return n.attr["data-field"] == "latest" }).attr["data-value"]
	}
	// Per poll: mem 30 hits and 10 misses, disk 5 hits; all tiers served
	// 35 of the 40 reads RAM saw.
	for series, want := range map[string]float64{"mem": 0.75, "disk": 1, "all tiers": 35.0 / 40} {
		if got, err := strconv.ParseFloat(latest("chart-hit-rate", series), 64); err != nil || math.Abs(got-want) > 1e-12 {
			t.Errorf("hit rate of %s: %q, want %v", series, latest("chart-hit-rate", series), want)
		}
	}
	// Throughput depends on the time between polls, so only its sign is
	// certain: zero where the counter stood still, positive where it grew.
	for _, c := range []struct {
		chart, series string
		moving        bool
	}{{"chart-read", "mem", false}, {"chart-read", "disk", true}, {"chart-write", "mem", true}, {"chart-write", "disk", false}} {
		got, err := strconv.ParseFloat(latest(c.chart, c.series), 64)
		if err != nil || (got > 0) != c.moving || got < 0 {
			t.Errorf("%s of %s: %q, want moving=%v", c.chart, c.series, latest(c.chart, c.series), c.moving)
		}
	}
	paths := doc.byID("chart-hit-rate").findAll(func(n *node) bool { return n.name == "path" })
	if len(paths) != 3 {
		t.Errorf("hit rate chart draws %d lines, want 3", len(paths))
	}
}

// TestBrowserRefusesForeignAPI checks that the api parameter cannot send
// the page's requests to another origin.
func TestBrowserRefusesForeignAPI(t *testing.T) {
	browser := findChromium(t)
	srv := httptest.NewServer(dashboard.Handler())
	defer srv.Close()
	doc := renderInBrowser(t, browser, srv.URL+"/?api=http://192.0.2.1/api/v1/stats")
	html := doc.find(func(n *node) bool { return n.name == "html" })
	if html.attr["data-ok"] == "true" || !strings.Contains(html.attr["data-error"], "origin") {
		t.Fatalf("page accepted a foreign API: %v", html.attrs())
	}
	if status := doc.byID("status"); status.attr["data-state"] != "error" {
		t.Fatalf("status %v, want an error", status.attrs())
	}
}
