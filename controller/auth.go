package controller

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"kvtier/internal/ratelog"
	"kvtier/internal/tlsreload"
	"kvtier/internal/webguard"
)

// clusterGuard wraps the cluster API (registry and operations) with the
// rules of docs/security.md: a request a web page of another origin made
// a browser send is refused when it is a mutation; with cluster_token
// every request must carry "Authorization: Bearer <token>" (the daemons'
// controller_token); without one the controller listens on loopback only
// (checkOpenListener) and answers loopback host names only, which defeats
// DNS rebinding. Whoever reaches an open registry can register a daemon,
// which makes the controller subscribe to and POST to addresses it names.
func clusterGuard(token string, h http.Handler, refused *ratelog.Limiter) http.Handler {
	tok := webguard.NewToken(token)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		status, err := checkCluster(tok, req)
		if err != nil {
			refused.Log("status", status, "method", req.Method, "path", req.URL.Path, "remote", req.RemoteAddr, "why", err.Error())
			if status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="kvtier cluster"`)
			}
			httpError(w, status, err)
			return
		}
		h.ServeHTTP(w, req)
	})
}

func checkCluster(tok webguard.Token, req *http.Request) (int, error) {
	if !tok.Set() && !webguard.LoopbackHost(req) {
		return http.StatusForbidden, errors.New("host is not loopback: without cluster_token the cluster API answers loopback names only")
	}
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		if why := webguard.CrossSite(req); why != "" {
			return http.StatusForbidden, fmt.Errorf("cross-origin request refused (%s)", why)
		}
	}
	if tok.Set() && !tok.Match(req) {
		return http.StatusUnauthorized,
			errors.New("missing or wrong cluster token: send Authorization: Bearer <cluster_token> (the daemons' controller_token)")
	}
	return 0, nil
}

// newRefusedLog rate-limits the lines about refused cluster requests: a
// misconfigured daemon beating every second with the wrong token would
// otherwise write one a second.
func newRefusedLog(log *slog.Logger) *ratelog.Limiter {
	return ratelog.New(log, slog.LevelWarn, "cluster request refused", 10*time.Second)
}

// checkOpenListener refuses a listener beyond loopback without a
// cluster_token: anyone who could reach it could register daemons, start
// cluster operations and read the cluster's membership.
func checkOpenListener(addr net.Addr, token string) error {
	if token != "" || webguard.LoopbackOnly(addr) {
		return nil
	}
	return fmt.Errorf("%s %s: a cluster_token (--cluster-token) is required to listen beyond loopback; "+
		"set it on the controller and as controller_token on the daemons", which("listen"), addr)
}

// bearerTransport presents the cluster token on the controller's calls to
// daemons' admin APIs (resync, cluster operations): a daemon accepts its
// controller_token, the same secret, on its cluster endpoints.
type bearerTransport struct {
	token string
	base  http.RoundTripper
}

func (t bearerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+t.token)
	return t.base.RoundTrip(req)
}

// daemonTransport is the transport of calls to daemons: with a token,
// each request presents it.
func daemonTransport(token string) http.RoundTripper {
	if token == "" {
		return http.DefaultTransport
	}
	return bearerTransport{token: token, base: http.DefaultTransport}
}

// listen opens the controller's HTTP listener: refused beyond loopback
// without cluster_token, over TLS with tls_cert and tls_key (the returned
// reloader, nil without TLS, rereads them on SIGHUP and on change).
func (c *controller) listen() (net.Listener, *tlsreload.Reloader, error) {
	var tr *tlsreload.Reloader
	if c.cfg.TLSCert != "" {
		var err error
		if tr, err = tlsreload.New(which("tls_cert"), c.cfg.TLSCert, c.cfg.TLSKey, c.log); err != nil {
			return nil, nil, err
		}
	}
	ln, err := net.Listen("tcp", c.cfg.Listen)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", which("listen"), err)
	}
	if err := checkOpenListener(ln.Addr(), c.cfg.ClusterToken); err != nil {
		ln.Close()
		return nil, nil, err
	}
	if tr != nil {
		ln = tls.NewListener(ln, tr.Config())
	}
	return ln, tr, nil
}
