package admin

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"kvtier/internal/ratelog"
	"kvtier/internal/tlsreload"
	"kvtier/internal/webguard"
	"kvtier/tenant"
)

// guard applies docs/security.md to every admin request before the mux:
//
//   - /healthz and /readyz are always open: probes carry no credentials.
//   - A request a web page of another origin made a browser send is
//     refused (403) when it is a mutation: no CORS, no cross-site POST.
//   - With admin_token, every mutation needs it (the cluster endpoints
//     also take controller_token, which the controller presents), and so
//     do the reads (/api/, /metrics) unless admin_read_open. The
//     dashboard's own files are served to anyone: they hold no data.
//   - Without a token the API listens on loopback alone (Listen refuses
//     more), and a Host header that does not name loopback is refused: a
//     page reaching 127.0.0.1 through DNS rebinding still names its own.
type guard struct {
	admin, controller webguard.Token
	readOpen          bool
	next              http.Handler
	refused           *ratelog.Limiter
	count             atomic.Uint64
	tenants           *tenant.Set // see tenants.go
}

func newGuard(adminToken, controllerToken string, readOpen bool, next http.Handler, log *slog.Logger) *guard {
	return &guard{admin: webguard.NewToken(adminToken), controller: webguard.NewToken(controllerToken),
		readOpen: readOpen, next: next,
		refused: ratelog.New(log, slog.LevelWarn, "admin request refused", 10*time.Second)}
}

func (g *guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
		g.next.ServeHTTP(w, r)
		return
	}
	if g.serveTenant(w, r) {
		return
	}
	if status, err := g.check(r); err != nil {
		g.count.Add(1)
		// Tokens never reach the log: only what the request was and why.
		g.refused.Log("status", status, "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "why", err.Error())
		if status == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kvtier admin"`)
		}
		writeError(w, status, err)
		return
	}
	g.next.ServeHTTP(w, r)
}

// check returns the status and reason that refuse r, or nil.
func (g *guard) check(r *http.Request) (int, error) {
	mutation := r.Method != http.MethodGet && r.Method != http.MethodHead
	if !g.admin.Set() && !webguard.LoopbackHost(r) {
		return http.StatusForbidden, fmt.Errorf("host %q is not loopback: without admin_token the admin API answers loopback names only", trim(r.Host))
	}
	if mutation {
		if why := webguard.CrossSite(r); why != "" {
			return http.StatusForbidden, fmt.Errorf("cross-origin request refused (%s): the admin API takes mutations from its own dashboard and from non-browser clients only", why)
		}
	}
	if !g.admin.Set() || g.admin.Match(r) {
		return 0, nil
	}
	if strings.HasPrefix(r.URL.Path, "/api/v1/cluster/") && g.controller.Match(r) {
		return 0, nil
	}
	read := !mutation && (strings.HasPrefix(r.URL.Path, "/api/") || r.URL.Path == "/metrics")
	switch {
	case mutation:
		return http.StatusUnauthorized, errors.New("missing or wrong admin token: send Authorization: Bearer <admin_token>")
	case read && !g.readOpen:
		return http.StatusUnauthorized, errors.New("missing or wrong admin token: send Authorization: Bearer <admin_token> (or set admin_read_open to open the reads)")
	}
	return 0, nil
}

func trim(s string) string {
	if len(s) > 100 {
		return s[:100] + "…"
	}
	return s
}

// Refused returns how many requests the guard refused since New.
func (a *API) Refused() uint64 { return a.guard.count.Load() }

// Listen opens the admin listener on admin_addr: refused beyond loopback
// without admin_token, and over TLS with admin_tls_cert and
// admin_tls_key (the returned reloader, nil without TLS, rereads them).
func (a *API) Listen() (net.Listener, *tlsreload.Reloader, error) {
	var tr *tlsreload.Reloader
	if a.cfg.AdminTLSCert != "" {
		var err error
		if tr, err = tlsreload.New("admin_tls_cert", a.cfg.AdminTLSCert, a.cfg.AdminTLSKey, a.log); err != nil {
			return nil, nil, err
		}
	}
	ln, err := net.Listen("tcp", a.cfg.AdminAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("admin_addr: %w", err)
	}
	if a.cfg.AdminToken == "" && !webguard.LoopbackOnly(ln.Addr()) {
		ln.Close()
		return nil, nil, fmt.Errorf("admin_addr %s: a token (admin_token / KVTIER_ADMIN_TOKEN) is required to listen beyond loopback", a.cfg.AdminAddr)
	}
	if tr != nil {
		ln = tlsListener(ln, tr)
	}
	return ln, tr, nil
}

func tlsListener(ln net.Listener, tr *tlsreload.Reloader) net.Listener {
	return tls.NewListener(ln, tr.Config())
}
