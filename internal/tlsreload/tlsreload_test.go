package tlsreload

import (
	"bytes"
	"crypto/tls"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kvtier/internal/tlstest"
)

// serve runs a TLS listener on loopback with r's configuration, answering
// each handshake and closing.
func serve(t *testing.T, r *Reloader) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", r.Config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				c.(*tls.Conn).Handshake()
				c.Close()
			}()
		}
	}()
	return ln.Addr().String()
}

// pair writes a certificate named cn at the fixed paths cert and key.
func pair(t *testing.T, ca *tlstest.CA, dir, cn, cert, key string) {
	t.Helper()
	c, k := ca.WriteServer(t, dir, cn)
	for _, mv := range [][2]string{{c, cert}, {k, key}} {
		if err := os.Rename(mv[0], mv[1]); err != nil {
			t.Fatal(err)
		}
	}
}

func setup(t *testing.T) (*tlstest.CA, string, string, string, *Reloader, *bytes.Buffer) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "test CA")
	cert, key := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	pair(t, ca, dir, "first", cert, key)
	var logs bytes.Buffer
	r, err := New("test_tls_cert", cert, key, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return ca, dir, cert, key, r, &logs
}

func TestReloadServesTheNewPair(t *testing.T) {
	ca, dir, cert, key, r, _ := setup(t)
	addr := serve(t, r)
	if cn := tlstest.PeerCN(t, addr, ca.ClientConfig()); cn != "first" {
		t.Fatalf("serving %q, want first", cn)
	}
	pair(t, ca, dir, "second", cert, key)
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if cn := tlstest.PeerCN(t, addr, ca.ClientConfig()); cn != "second" {
		t.Fatalf("after Reload serving %q, want second", cn)
	}
}

func TestFileChangeIsNoticedByHandshakes(t *testing.T) {
	ca, dir, cert, key, r, _ := setup(t)
	addr := serve(t, r)
	pair(t, ca, dir, "second", cert, key)
	// Before CheckEvery has passed the old pair serves: no file read per handshake.
	r.nextCheck.Store(time.Now().Add(time.Hour).UnixNano())
	if cn := tlstest.PeerCN(t, addr, ca.ClientConfig()); cn != "first" {
		t.Fatalf("serving %q before the check is due, want first", cn)
	}
	r.nextCheck.Store(0) // the check is due
	if cn := tlstest.PeerCN(t, addr, ca.ClientConfig()); cn != "second" {
		t.Fatalf("serving %q after the files changed, want second", cn)
	}
}

func TestBadNewFileKeepsTheOldCertificate(t *testing.T) {
	ca, dir, cert, key, r, logs := setup(t)
	addr := serve(t, r)
	tlstest.WriteFile(t, cert, []byte("-----BEGIN CERTIFICATE-----\nnot base64\n"))
	if err := r.Reload(); err == nil {
		t.Fatal("Reload of a garbage certificate succeeded")
	}
	r.nextCheck.Store(0)
	if cn := tlstest.PeerCN(t, addr, ca.ClientConfig()); cn != "first" {
		t.Fatalf("serving %q after a bad reload, want the old first", cn)
	}
	if r.Failures() != 1 || !strings.Contains(logs.String(), "previous one keeps serving") {
		t.Fatalf("failures %d, log:\n%s", r.Failures(), logs)
	}
	// A key that does not match the certificate is refused too.
	other, _ := ca.WriteServer(t, dir, "other")
	data, _ := os.ReadFile(other)
	tlstest.WriteFile(t, cert, data)
	if err := r.Reload(); err == nil {
		t.Fatal("Reload of a certificate with another key succeeded")
	}
	if cn := tlstest.PeerCN(t, addr, ca.ClientConfig()); cn != "first" {
		t.Fatalf("serving %q after a mismatched reload, want first", cn)
	}
	// A good pair after bad ones serves again.
	pair(t, ca, dir, "third", cert, key)
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if cn := tlstest.PeerCN(t, addr, ca.ClientConfig()); cn != "third" {
		t.Fatalf("serving %q, want third", cn)
	}
}

func TestNewRefusesABadPair(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, cert, key string }{
		{"missing", filepath.Join(dir, "none.crt"), filepath.Join(dir, "none.key")},
	} {
		_, err := New("admin_tls_cert", tc.cert, tc.key, nil)
		if err == nil || !strings.HasPrefix(err.Error(), "admin_tls_cert: ") {
			t.Errorf("%s: err %v, want one naming admin_tls_cert", tc.name, err)
		}
	}
}

func TestSIGHUPReloads(t *testing.T) {
	ca, dir, cert, key, r, _ := setup(t)
	addr := serve(t, r)
	stop := OnSIGHUP(r)
	defer stop()
	pair(t, ca, dir, "second", cert, key)
	r.nextCheck.Store(time.Now().Add(time.Hour).UnixNano()) // only the signal may reload
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for tlstest.PeerCN(t, addr, ca.ClientConfig()) != "second" {
		if time.Now().After(deadline) {
			t.Fatal("SIGHUP did not reload the certificate within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// BenchmarkGetCertificate is the cost a handshake pays for reloading:
// an atomic load, and two small file reads once a second.
func BenchmarkGetCertificate(b *testing.B) {
	dir := b.TempDir()
	ca := tlstest.NewCA(b, "bench CA")
	cert, key := ca.WriteServer(b, dir, "bench")
	r, err := New("bench", cert, key, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if c, _ := r.GetCertificate(nil); c == nil {
			b.Fatal("no certificate")
		}
	}
}
