package controller

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net"
	"net/http"
)

// requireToken wraps the registry API so that every request must carry
// "Authorization: Bearer <token>" (the controller's cluster_token); with
// no token it returns h as is. Whoever reaches an open registry can
// register a daemon, which makes the controller subscribe to and POST to
// addresses it names, so a controller reachable beyond its host wants one.
func requireToken(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	// Digests of equal length make the comparison's time independent of
	// the presented token, its length included.
	want := sha256.Sum256([]byte("Bearer " + token))
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		got := sha256.Sum256([]byte(req.Header.Get("Authorization")))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kvtier cluster"`)
			httpError(w, http.StatusUnauthorized,
				errors.New("missing or wrong cluster token: send Authorization: Bearer <cluster_token> (the daemons' controller_token)"))
			return
		}
		h.ServeHTTP(w, req)
	})
}

// warnOpenRegistry logs a warning when the registry listens beyond
// loopback without a cluster_token: anyone who can reach it can register
// daemons and read the cluster's membership.
func warnOpenRegistry(addr net.Addr, token string, log *slog.Logger) {
	if token != "" || loopbackOnly(addr) {
		return
	}
	log.Warn("the cluster registry is reachable beyond loopback without authentication: set cluster_token "+
		"(--cluster-token) on the controller and controller_token on the daemons", "addr", addr.String())
}

// loopbackOnly reports whether addr accepts connections from this host
// alone: a loopback IP, not a wildcard.
func loopbackOnly(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}
