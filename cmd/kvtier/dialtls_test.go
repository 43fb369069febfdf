package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvtier/internal/tlstest"
)

// TestDialTLS: tcp_tls_ca unset dials plain TCP; a CA file gives a
// configuration that trusts it; a missing file or one without a PEM
// certificate is an error naming the key.
func TestDialTLS(t *testing.T) {
	if c, err := dialTLS(""); c != nil || err != nil {
		t.Fatalf("unset: %v %v", c, err)
	}
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "fleet")
	certFile, _ := ca.WriteServer(t, dir, "node")
	c, err := dialTLS(certFile) // a PEM certificate, trusted as a root
	if err != nil || c == nil || c.RootCAs == nil {
		t.Fatalf("a certificate file: %v %v", c, err)
	}
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{filepath.Join(dir, "missing.pem"), junk} {
		if _, err := dialTLS(f); err == nil || !strings.Contains(err.Error(), "tcp_tls_ca") {
			t.Errorf("%s: %v, want an error naming tcp_tls_ca", f, err)
		}
	}
}
