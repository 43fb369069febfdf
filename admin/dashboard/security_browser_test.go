package dashboard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"testing"
	"time"

	"kvtier/admin"
	"kvtier/config"
	"kvtier/engine"
)

// guardedDaemon serves a real engine's admin API (dashboard included)
// with cfg's admin settings.
func guardedDaemon(t *testing.T, cfg config.Config) (*engine.Engine, *admin.API, string) {
	t.Helper()
	eng, err := engine.Open(engine.Options{ChunkSize: testChunkTokens, RAMBytes: 64 << 20, Policy: "LRU",
		DiskDir: t.TempDir(), DiskBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	exercise(t, eng)
	adm, err := admin.New(eng, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(adm.Handler())
	t.Cleanup(srv.Close)
	return eng, adm, srv.URL
}

// TestBrowserDashboardWithToken: with admin_token set and the reads
// closed, the dashboard asks for the token, and renders once it has it
// (handed over in the fragment, which the page then removes).
func TestBrowserDashboardWithToken(t *testing.T) {
	browser := findChromium(t)
	cfg := config.Default()
	cfg.AdminToken = "dash-token"
	_, adm, base := guardedDaemon(t, cfg)
	typed, generic := getStatsWith(t, base, "dash-token")

	doc := renderInBrowser(t, browser, base+"/")
	html := doc.find(func(n *node) bool { return n.name == "html" })
	if html.attr["data-auth"] != "required" || html.attr["data-ok"] == "true" {
		t.Fatalf("without a token the page should ask for one: %v", html.attrs())
	}
	if form := doc.byID("auth"); form == nil || hasAttr(form, "hidden") {
		t.Fatal("the token form is not shown")
	}
	refused := adm.Refused()
	if refused == 0 {
		t.Fatal("the page's read was not refused")
	}

	doc = renderInBrowser(t, browser, base+"/#token=dash-token")
	html = doc.find(func(n *node) bool { return n.name == "html" })
	if html.attr["data-auth"] != "" || !hasAttr(doc.byID("auth"), "hidden") {
		t.Fatalf("with the token the page still asks for it: %v", html.attrs())
	}
	checkRendered(t, doc, typed, generic)
	if adm.Refused() != refused {
		t.Errorf("the page with the token was refused %d times", adm.Refused()-refused)
	}
}

func hasAttr(n *node, name string) bool {
	if n == nil {
		return false
	}
	_, ok := n.attr[name]
	return ok
}

// getStatsWith is getStats with a bearer token.
func getStatsWith(t *testing.T, base, token string) (engine.Stats, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/api/v1/stats", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
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

// TestBrowserForeignPageCannotClear: a page of another origin (another
// port of the same host) makes the browser POST to the admin API the way
// an attack would — a no-cors fetch with a text/plain body, and a form
// submitted by script. The admin API refuses both; the chunks stay.
func TestBrowserForeignPageCannotClear(t *testing.T) {
	browser := findChromium(t)
	eng, adm, base := guardedDaemon(t, config.Default())
	before := eng.Manager().RAM().Stats().Objects
	if before == 0 {
		t.Fatal("the fixture stored nothing")
	}
	page := fmt.Sprintf(`<!doctype html><html><body>
<iframe name="sink"></iframe>
<form id="f" method="POST" action="%[1]s/api/v1/flush" enctype="text/plain" target="sink"><input name="x" value="y"></form>
<script>
fetch(%[1]q + "/api/v1/clear", {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: "{}"})
  .finally(() => { document.body.dataset.sent = "1"; document.getElementById("f").submit(); });
</script></body></html>`, base)
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write([]byte(page))
	}))
	defer evil.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu",
		"--disable-background-networking", "--disable-extensions", "--no-first-run",
		"--disable-dev-shm-usage", "--user-data-dir="+t.TempDir(),
		"--virtual-time-budget=3000", "--dump-dom", evil.URL+"/")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", browser, err, out.String())
	}
	// Both requests reached the daemon and were refused there (not merely
	// blocked by the browser), and the chunks are all still in RAM.
	if got := adm.Refused(); got < 2 {
		t.Fatalf("the admin API refused %d requests, want the fetch and the form; browser:\n%s", got, out.String())
	}
	if after := eng.Manager().RAM().Stats().Objects; after != before {
		t.Fatalf("RAM holds %d chunks after the foreign page ran, want %d", after, before)
	}
}
