package dashboard

import (
	"bytes"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"regexp"
	"strings"
	"testing"
)

// wantTypes is what each kind of asset must be served as; it is written
// out again here rather than read from the package's table, so that a
// wrong entry there fails.
var wantTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".svg":  "image/svg+xml",
}

func get(t *testing.T, h http.Handler, method, target string, header ...string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func body(t *testing.T, res *http.Response) []byte {
	t.Helper()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// mounts are the ways the lead's server and its tests mount the handler:
// a mux pattern, and the URL prefix the dashboard then lives under.
func mounts() map[string]http.Handler {
	root := http.NewServeMux()
	root.Handle("/", Handler())
	sub := http.NewServeMux()
	sub.Handle("/dashboard/", Handler())
	stripped := http.NewServeMux()
	stripped.Handle("/dashboard/", http.StripPrefix("/dashboard", Handler()))
	methodPattern := http.NewServeMux()
	methodPattern.Handle("GET /dashboard/{rest...}", Handler())
	return map[string]http.Handler{"/": root, "/dashboard/": sub, "/dashboard/ (stripped)": stripped,
		"/dashboard/ (GET pattern)": methodPattern, "/ (bare)": Handler()}
}

func TestEveryAssetServedWithItsType(t *testing.T) {
	var files []string
	err := fs.WalkDir(static, "static", func(name string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, name)
		}
		return err
	})
	if err != nil || len(files) < 3 {
		t.Fatalf("embedded files %v: %v", files, err)
	}
	for mount, h := range mounts() {
		prefix := strings.Fields(mount)[0]
		for _, name := range files {
			rel := strings.TrimPrefix(name, "static/")
			target := prefix + rel
			if rel == indexName {
				target = prefix // the page lives at the mount point itself
			}
			res := get(t, h, http.MethodGet, target)
			if res.StatusCode != http.StatusOK {
				t.Errorf("mount %s: GET %s: %d", mount, target, res.StatusCode)
				continue
			}
			if got, want := res.Header.Get("Content-Type"), wantTypes[path.Ext(name)]; got != want || want == "" {
				t.Errorf("mount %s: GET %s: Content-Type %q, want %q", mount, target, got, want)
			}
			for _, h := range []string{"ETag", "Content-Security-Policy"} {
				if res.Header.Get(h) == "" {
					t.Errorf("mount %s: GET %s: no %s header", mount, target, h)
				}
			}
			if res.Header.Get("X-Content-Type-Options") != "nosniff" {
				t.Errorf("mount %s: GET %s: no nosniff", mount, target)
			}
			got := body(t, res)
			if want, _ := static.ReadFile(name); rel != indexName && !bytes.Equal(got, want) {
				t.Errorf("mount %s: GET %s: body differs from the embedded file", mount, target)
			}
		}
	}
}

func TestUnknownPathsAre404(t *testing.T) {
	for mount, h := range mounts() {
		prefix := strings.Fields(mount)[0]
		for _, rel := range []string{"nope", "static/app.js", "app.js/", "sub/", "sub/app.js", "index.html", "APP.JS"} {
			if res := get(t, h, http.MethodGet, prefix+rel); res.StatusCode != http.StatusNotFound {
				t.Errorf("mount %s: GET %s%s: %d, want 404", mount, prefix, rel, res.StatusCode)
			}
		}
	}
}

var apiRootAttr = regexp.MustCompile(`data-api-root="([^"]*)"`)

// TestPageKnowsWhereTheAPIIs checks the page, wherever it is mounted,
// resolves api/v1/stats to the admin API at the site root, and that every
// file it links to resolves to a file the handler serves.
func TestPageKnowsWhereTheAPIIs(t *testing.T) {
	deep := http.NewServeMux()
	deep.Handle("/ops/kvtier/", Handler())
	cases := map[string]http.Handler{"/": mounts()["/"], "/dashboard/": mounts()["/dashboard/"],
		"/dashboard/?interval=500": mounts()["/dashboard/ (stripped)"], "/ops/kvtier/": deep}
	for pageURL, h := range cases {
		res := get(t, h, http.MethodGet, pageURL)
		page := body(t, res)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", pageURL, res.StatusCode)
		}
		m := apiRootAttr.FindSubmatch(page)
		if m == nil {
			t.Fatalf("GET %s: no data-api-root in the page", pageURL)
		}
		base, _ := url.Parse("http://host" + pageURL)
		if got := base.ResolveReference(&url.URL{Path: string(m[1]) + "api/v1/stats"}).Path; got != "/api/v1/stats" {
			t.Errorf("page at %s fetches %s, want /api/v1/stats", pageURL, got)
		}
		for _, link := range regexp.MustCompile(`(?:src|href)="([^"]+)"`).FindAllSubmatch(page, -1) {
			ref := string(link[1])
			if strings.HasPrefix(ref, "data:") {
				continue
			}
			target := base.ResolveReference(&url.URL{Path: ref}).Path
			if res := get(t, h, http.MethodGet, target); res.StatusCode != http.StatusOK {
				t.Errorf("page at %s links %s, which answers %d", pageURL, target, res.StatusCode)
			}
		}
	}
}

func TestPageWithoutTrailingSlashRedirects(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("/dashboard", http.StripPrefix("/dashboard", Handler()))
	res := get(t, mux, http.MethodGet, "/dashboard?interval=500")
	if res.StatusCode != http.StatusMovedPermanently || res.Header.Get("Location") != "dashboard/?interval=500" {
		t.Fatalf("GET /dashboard: %d to %q, want 301 to dashboard/?interval=500", res.StatusCode, res.Header.Get("Location"))
	}
}

func TestMethods(t *testing.T) {
	h := Handler()
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		res := get(t, h, method, "/app.js")
		if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s /app.js: %d, Allow %q", method, res.StatusCode, res.Header.Get("Allow"))
		}
	}
	res := get(t, h, http.MethodHead, "/style.css")
	if res.StatusCode != http.StatusOK || len(body(t, res)) != 0 || res.Header.Get("Content-Type") != wantTypes[".css"] {
		t.Errorf("HEAD /style.css: %d %q", res.StatusCode, res.Header.Get("Content-Type"))
	}
}

func TestRevalidationByETag(t *testing.T) {
	h := Handler()
	for _, target := range []string{"/", "/app.js"} {
		etag := get(t, h, http.MethodGet, target).Header.Get("ETag")
		if res := get(t, h, http.MethodGet, target, "If-None-Match", etag); res.StatusCode != http.StatusNotModified {
			t.Errorf("GET %s with its ETag %s: %d, want 304", target, etag, res.StatusCode)
		}
		if res := get(t, h, http.MethodGet, target, "If-None-Match", `"stale"`); res.StatusCode != http.StatusOK {
			t.Errorf("GET %s with a stale ETag: %d, want 200", target, res.StatusCode)
		}
	}
	// The page's ETag covers the API root written into it.
	sub := mounts()["/dashboard/"]
	if a, b := get(t, h, http.MethodGet, "/").Header.Get("ETag"), get(t, sub, http.MethodGet, "/dashboard/").Header.Get("ETag"); a == b {
		t.Errorf("pages at / and /dashboard/ share the ETag %s", a)
	}
}

func TestPatternPath(t *testing.T) {
	for pattern, want := range map[string]string{
		"":                                 "",
		"/":                                "/",
		"/dashboard/":                      "/dashboard/",
		"GET /dashboard/":                  "/dashboard/",
		"GET  example.com/dashboard/":      "/dashboard/",
		"/dashboard/{rest...}":             "/dashboard/",
		"/x/{id}/dash/":                    "/x/",
		"/dashboard/app.js":                "/dashboard/",
		"example.com/":                     "/",
		"GET example.com/a/b/{$}":          "/a/b/",
		"HEAD /a":                          "/",
		"GET /{path...}":                   "/",
		"POST example.com/ops/kvtier/{x}/": "/ops/kvtier/",
	} {
		if got := patternPath(pattern); got != want {
			t.Errorf("patternPath(%q) = %q, want %q", pattern, got, want)
		}
	}
}
