// Package dashboard serves the daemon's live dashboard: one HTML page, a
// style sheet and a script, embedded in the binary so that it works
// offline and needs no build step or JavaScript framework.
//
// The page polls the admin API's stats endpoint (once a second unless
// told otherwise) and draws what it reads: each tier's usage, the write
// queues, the RAM arena, and charts of hit rate and throughput over the
// last polls. Rates are computed in the browser from the difference of
// the counters between two polls, so the daemon serves nothing beyond the
// stats it already keeps.
//
// # Where the page finds the API
//
// The handler serves at whatever fixed path it is mounted on ("/",
// "/dashboard/", or below http.StripPrefix). The page fetches the stats
// with a URL relative to itself: the handler writes into the page how far
// up the site root is ("" for a page at "/", "../" for one at
// "/dashboard/"), and the script appends "api/v1/stats". This assumes the
// dashboard and the admin API share one server, and it stays right behind
// a reverse proxy that moves the whole admin server under a prefix. Two
// query parameters change the defaults: api (a same-origin URL of the
// stats endpoint, relative to the page or absolute) and interval (the
// polling period in milliseconds).
//
// Every number the page shows sits in an element that names what it is —
// data-tier="mem" data-field="used_bytes", data-queue="disk"
// data-field="dropped", data-group="arena" data-field="leases" — with the
// exact value in data-value and a formatted one as its text. The root
// element gets data-ok="true" after the first successful render, and
// data-polls counts the renders; tests and scripts read those.
package dashboard

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"
)

//go:embed static
var static embed.FS

// indexName is the page served at the mount point itself. It is a
// template: the only thing filled in is where the API is.
const indexName = "index.html"

// contentTypes names the type of every kind of file under static/. It is
// fixed here rather than taken from the mime package, whose answers
// depend on the host's /etc/mime.types.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".svg":  "image/svg+xml",
}

// securityPolicy lets the page load only its own files and fetch only
// from its own origin; it also keeps the dashboard out of frames.
const securityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// asset is one static file, ready to serve.
type asset struct {
	body        []byte
	contentType string
	etag        string
}

var (
	assets = loadAssets()
	index  = template.Must(template.ParseFS(static, "static/"+indexName))
)

// loadAssets reads every embedded file except the page template. A file
// whose type is unknown stops the program at start-up: it is a mistake in
// this package, found by its tests.
func loadAssets() map[string]asset {
	out := map[string]asset{}
	err := fs.WalkDir(static, "static", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || path.Base(name) == indexName {
			return err
		}
		ctype, ok := contentTypes[path.Ext(name)]
		if !ok {
			return fmt.Errorf("no content type for %s", name)
		}
		body, err := static.ReadFile(name)
		if err != nil {
			return err
		}
		out[strings.TrimPrefix(name, "static/")] = asset{body: body, contentType: ctype, etag: etagOf(body)}
		return nil
	})
	if err != nil {
		panic("dashboard: loading embedded assets: " + err.Error())
	}
	return out
}

func etagOf(body []byte) string {
	sum := sha256.Sum256(body)
	return `"` + hex.EncodeToString(sum[:12]) + `"`
}

// Handler returns the dashboard's HTTP handler. Mount it on a fixed path
// that ends in a slash, directly or below http.StripPrefix; it answers
// 404 for paths it does not know, and 405 for methods other than GET and
// HEAD.
func Handler() http.Handler { return http.HandlerFunc(serve) }

func serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	name := relativePath(r)
	if name == "" {
		servePage(w, r)
		return
	}
	a, ok := assets[name]
	if !ok {
		http.NotFound(w, r)
		return
	}
	serveBytes(w, r, a)
}

// relativePath is the request's path below the mount point. Under a
// ServeMux the mount point is the path of the pattern that matched (up to
// any wildcard); under http.StripPrefix the path no longer starts with
// it, and is taken as it is.
func relativePath(r *http.Request) string {
	p := r.URL.Path
	if mount := patternPath(r.Pattern); mount != "" && strings.HasPrefix(p, mount) {
		return p[len(mount):]
	}
	return strings.TrimPrefix(p, "/")
}

// patternPath returns the directory part of a ServeMux pattern such as
// "GET example.com/dashboard/{rest...}": "/dashboard/".
func patternPath(pattern string) string {
	if _, rest, ok := strings.Cut(pattern, " "); ok {
		pattern = strings.TrimLeft(rest, " \t")
	}
	i := strings.IndexByte(pattern, '/')
	if i < 0 {
		return ""
	}
	pattern = pattern[i:]
	if j := strings.IndexByte(pattern, '{'); j >= 0 {
		pattern = pattern[:j]
	}
	return pattern[:strings.LastIndexByte(pattern, '/')+1]
}

// servePage serves the page, telling it where the site root is relative
// to the page's own URL. A page URL without its final slash would resolve
// the page's relative links one directory too high, so it redirects.
func servePage(w http.ResponseWriter, r *http.Request) {
	browserPath := requestedPath(r)
	if !strings.HasSuffix(browserPath, "/") {
		target := path.Base(browserPath) + "/" // relative, so it survives proxies
		if r.URL.RawQuery != "" {
			target += "?" + r.URL.RawQuery
		}
		// Not http.Redirect: it would make target absolute against
		// r.URL.Path, which http.StripPrefix or a proxy may have changed.
		w.Header().Set("Location", target)
		w.WriteHeader(http.StatusMovedPermanently)
		return
	}
	var page bytes.Buffer
	data := struct{ APIRoot string }{APIRoot: strings.Repeat("../", strings.Count(browserPath, "/")-1)}
	if err := index.Execute(&page, data); err != nil { // cannot fail for a string field
		http.Error(w, "rendering the dashboard: "+err.Error(), http.StatusInternalServerError)
		return
	}
	body := page.Bytes()
	serveBytes(w, r, asset{body: body, contentType: contentTypes[".html"], etag: etagOf(body)})
}

// requestedPath is the path the browser asked for, before any
// http.StripPrefix: relative URLs in the page resolve against it.
func requestedPath(r *http.Request) string {
	if u, err := url.ParseRequestURI(r.RequestURI); err == nil && u.Path != "" {
		return u.Path
	}
	if r.URL.Path == "" {
		return "/"
	}
	return r.URL.Path
}

// serveBytes answers with a, letting clients revalidate by ETag: after an
// upgrade of the daemon they get the new files, and until then a 304.
func serveBytes(w http.ResponseWriter, r *http.Request, a asset) {
	h := w.Header()
	h.Set("Content-Type", a.contentType)
	h.Set("ETag", a.etag)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", securityPolicy)
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
}
