package redis

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

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
	caKey, caCert, caDER := makeCA(t, "kvtier test CA")
	p.ca = p.writePEM(t, "ca.pem", "CERTIFICATE", caDER)
	_, _, otherDER := makeCA(t, "unrelated CA")
	p.other = p.writePEM(t, "other.pem", "CERTIFICATE", otherDER)
	p.srvCert, p.srvKey = p.leaf(t, "server", caCert, caKey, x509.ExtKeyUsageServerAuth)
	p.cliCert, p.cliKey = p.leaf(t, "client", caCert, caKey, x509.ExtKeyUsageClientAuth)
	return p
}

func makeCA(t *testing.T, name string) (*ecdsa.PrivateKey, *x509.Certificate, []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert, der
}

func (p pki) leaf(t *testing.T, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return p.writePEM(t, name+".pem", "CERTIFICATE", der), p.writePEM(t, name+".key", "EC PRIVATE KEY", keyDER)
}

func (p pki) writePEM(t *testing.T, name, kind string, der []byte) string {
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
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
