package redis

import (
	"bytes"
	"context"
	"crypto/tls"
	"net/url"
	"testing"
	"time"

	"kvtier/internal/tlstest"
	"kvtier/tier/remote"
)

// pki is a throw-away CA with one server and one client certificate,
// written as PEM files.
type pki struct {
	dir                    string
	ca, srvCert, srvKey    string
	cliCert, cliKey, other string // other: a CA that signed nothing here
}

func newPKI(t *testing.T) pki {
	t.Helper()
	p := pki{dir: t.TempDir()}
	ca := tlstest.NewCA(t, "kvtier test CA")
	p.ca = ca.WriteCA(t, p.dir, "ca.pem")
	p.other = tlstest.NewCA(t, "unrelated CA").WriteCA(t, p.dir, "other.pem")
	p.srvCert, p.srvKey = ca.WriteServer(t, p.dir, "server")
	p.cliCert, p.cliKey = ca.WriteClient(t, p.dir, "client")
	return p
}

// TestTLS runs a round trip over rediss:// against a redis-server that
// speaks only TLS and requires client certificates.
func TestTLS(t *testing.T) {
	p := newPKI(t)
	srv := startServer(t, "--port", "0", "--tls-port", "{port}",
		"--tls-cert-file", p.srvCert, "--tls-key-file", p.srvKey,
		"--tls-ca-cert-file", p.ca, "--tls-auth-clients", "yes")
	clientPair, err := tls.LoadX509KeyPair(p.cliCert, p.cliKey)
	if err != nil {
		t.Fatal(err)
	}
	roots, err := tlsConfig(p.ca, "", "")
	if err != nil {
		t.Fatal(err)
	}
	srv.tls = &tls.Config{RootCAs: roots.RootCAs, Certificates: []tls.Certificate{clientPair}}
	srv.waitReady()

	base := "rediss://" + srv.addr() + "?ca=" + url.QueryEscape(p.ca)
	tr := openTier(t, base+"&cert="+url.QueryEscape(p.cliCert)+"&key="+url.QueryEscape(p.cliKey))
	ctx := context.Background()
	k := testKey(uniqueScope(), 0)
	data := payload(8<<20, 5)
	if err := tr.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, len(data))
	if n, err := tr.Get(ctx, k, dst); err != nil || !bytes.Equal(dst[:n], data) {
		t.Fatalf("TLS round trip: %d, %v", n, err)
	}

	refused := map[string]string{
		"no client certificate":   base,
		"server cert not trusted": "rediss://" + srv.addr() + "?ca=" + url.QueryEscape(p.other) + "&cert=" + url.QueryEscape(p.cliCert) + "&key=" + url.QueryEscape(p.cliKey),
		"plain TCP to TLS port":   "redis://" + srv.addr(),
	}
	for why, raw := range refused {
		if _, err := remote.Open(ctx, raw, remote.Options{Timeout: 2 * time.Second}); err == nil {
			t.Errorf("%s: Open succeeded", why)
		}
	}
}
