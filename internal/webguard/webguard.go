// Package webguard holds the checks kvtier's HTTP servers (the daemon's
// admin API, the controller's cluster API) apply before a request reaches
// a handler: a bearer token compared in constant time, the refusal of
// requests a web page of another origin made a browser send, and the
// refusal of host names that only DNS rebinding would send to a
// loopback-only server. See docs/security.md.
package webguard

import (
	"crypto/sha256"
	"crypto/subtle"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// Token is a shared secret presented as "Authorization: Bearer <token>".
// The zero value is no token.
type Token struct {
	want [sha256.Size]byte
	set  bool
}

// NewToken returns the token s; "" is no token.
func NewToken(s string) Token {
	if s == "" {
		return Token{}
	}
	return Token{want: sha256.Sum256([]byte("Bearer " + s)), set: true}
}

// Set reports whether there is a token.
func (t Token) Set() bool { return t.set }

// Match reports whether r presents the token. Comparing digests of equal
// length keeps the time independent of the presented value, its length
// included. No token matches nothing.
func (t Token) Match(r *http.Request) bool {
	if !t.set {
		return false
	}
	got := sha256.Sum256([]byte(r.Header.Get("Authorization")))
	return subtle.ConstantTimeCompare(got[:], t.want[:]) == 1
}

// CrossSite reports why r looks sent by a web page of another origin than
// the server's own, or "" when it does not. Browsers attach Sec-Fetch-Site
// and Origin to what pages send; tools such as curl send neither, and are
// let through. A page's own requests (the dashboard's) carry the server's
// origin. An Origin of "null" (sandboxed frames, file: pages) is foreign.
func CrossSite(r *http.Request) string {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return "Sec-Fetch-Site: " + site
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return ""
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return "Origin " + quote(origin)
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if !strings.EqualFold(u.Scheme, scheme) || !strings.EqualFold(u.Host, r.Host) {
		return "Origin " + quote(origin) + " is not " + scheme + "://" + r.Host
	}
	return ""
}

// quote bounds what a client sent before it goes into an error message.
func quote(s string) string {
	if len(s) > 100 {
		s = s[:100] + "…"
	}
	return `"` + s + `"`
}

// LoopbackHost reports whether r's Host header names the loopback
// interface: localhost or a loopback IP, with any port. A server that
// listens on loopback alone and has no token must check it: a page whose
// own host name resolves to 127.0.0.1 (DNS rebinding) is same-origin in
// the browser's eyes, but still names its own host.
func LoopbackHost(r *http.Request) bool {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// LoopbackOnly reports whether addr accepts connections from this host
// alone: a loopback IP, not a wildcard.
func LoopbackOnly(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}
