package admin

import (
	"bytes"
	"crypto/tls"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"kvtier/config"
	"kvtier/internal/tlstest"
)

// send makes a request with headers (name, value pairs) and returns the
// status and body.
func send(t *testing.T, method, url string, headers ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(""))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == "Host" {
			req.Host = headers[i+1]
			continue
		}
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

func (f *fixture) ramObjects() int64 { return f.eng.Manager().RAM().Stats().Objects }

// TestCrossOriginClearIsRefused: the request a foreign web page makes a
// browser send (a "simple" POST, which needs no preflight) used to clear
// the cache; it is refused now, with or without a token, and the chunks
// stay. curl-like clients without Origin keep working on loopback.
func TestCrossOriginClearIsRefused(t *testing.T) {
	f := newFixture(t, config.Default())
	for _, h := range [][]string{
		{"Origin", "http://evil.example", "Content-Type", "text/plain"},
		{"Sec-Fetch-Site", "cross-site"},
		{"Origin", "null"},
		{"Origin", "http://127.0.0.1:1"}, // another port of the same host is another origin
	} {
		status, body := send(t, "POST", f.url+"/api/v1/clear", h...)
		if status != http.StatusForbidden || !strings.Contains(body, "cross-origin") {
			t.Errorf("POST clear with %v = %d %s, want 403", h, status, body)
		}
		if status, _ := send(t, "POST", f.url+"/api/v1/flush", h...); status != http.StatusForbidden {
			t.Errorf("POST flush with %v = %d, want 403", h, status)
		}
	}
	if n := f.ramObjects(); n != numChunks {
		t.Fatalf("RAM holds %d chunks after refused clears, want %d", n, numChunks)
	}
	// The dashboard's own origin and plain clients are let through.
	status, body := send(t, "POST", f.url+"/api/v1/clear", "Origin", f.url, "Sec-Fetch-Site", "same-origin")
	if status != http.StatusOK || f.ramObjects() != 0 {
		t.Fatalf("same-origin clear = %d %s; RAM holds %d", status, body, f.ramObjects())
	}
	if f.admin.Refused() != 8 {
		t.Errorf("Refused() = %d, want 8", f.admin.Refused())
	}
	// No CORS: nothing invites a page to read the answers either.
	req, _ := http.NewRequest("OPTIONS", f.url+"/api/v1/clear", nil)
	req.Header.Set("Origin", "http://evil.example")
	req.Header.Set("Access-Control-Request-Method", "POST")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 == 2 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("preflight = %d %v, want a refusal without CORS headers", resp.StatusCode, resp.Header)
	}
}

// TestWithoutTokenOnlyLoopbackNames: a DNS-rebinding page reaches
// 127.0.0.1 under its own host name; without a token that is refused,
// probes excepted.
func TestWithoutTokenOnlyLoopbackNames(t *testing.T) {
	f := newFixture(t, config.Default())
	for _, path := range []string{"/api/v1/stats", "/api/v1/keys", "/metrics", "/"} {
		if status, _ := send(t, "GET", f.url+path, "Host", "rebind.evil.example:7480"); status != http.StatusForbidden {
			t.Errorf("GET %s with a foreign Host = %d, want 403", path, status)
		}
		if status, _ := send(t, "GET", f.url+path, "Host", "localhost"); status != http.StatusOK {
			t.Errorf("GET %s with Host localhost = %d, want 200", path, status)
		}
	}
	if status, _ := send(t, "POST", f.url+"/api/v1/clear", "Host", "rebind.evil.example:7480"); status != http.StatusForbidden {
		t.Errorf("POST clear with a foreign Host = %d, want 403", status)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if status, _ := send(t, "GET", f.url+path, "Host", "10.1.2.3:7480"); status != http.StatusOK {
			t.Errorf("probe %s = %d, want 200 whatever the Host", path, status)
		}
	}
}

func TestTokenGuardsMutationsAndReads(t *testing.T) {
	cfg := config.Default()
	cfg.AdminToken = "adm-secret"
	cfg.ControllerToken = "ctl-secret"
	f := newFixture(t, cfg)
	var resyncs atomic.Int32
	f.admin.HandleClusterResync(func() { resyncs.Add(1) })
	good := []string{"Authorization", "Bearer adm-secret"}

	for _, h := range [][]string{nil, {"Authorization", "Bearer wrong"}, {"Authorization", "adm-secret"},
		{"Authorization", "Bearer ctl-secret"}} {
		if status, body := send(t, "POST", f.url+"/api/v1/clear", h...); status != http.StatusUnauthorized ||
			!strings.Contains(body, "admin_token") {
			t.Errorf("POST clear with %v = %d %s, want 401", h, status, body)
		}
		for _, path := range []string{"/api/v1/stats", "/api/v1/config", "/api/v1/keys", "/api/v1/scopes", "/metrics"} {
			if status, _ := send(t, "GET", f.url+path, h...); status != http.StatusUnauthorized {
				t.Errorf("GET %s with %v = %d, want 401 (reads are closed by default)", path, h, status)
			}
		}
	}
	if f.ramObjects() != numChunks {
		t.Fatal("a refused clear removed chunks")
	}
	// The token does not make a cross-origin page's request acceptable.
	if status, _ := send(t, "POST", f.url+"/api/v1/clear", append(good, "Origin", "http://evil.example")...); status != http.StatusForbidden {
		t.Errorf("POST clear with the token from a foreign origin = %d, want 403", status)
	}
	// Probes and the dashboard's files are open; a token-holding client
	// may use any Host name (the API listens beyond loopback).
	for _, path := range []string{"/healthz", "/readyz", "/", "/dashboard/app.js"} {
		if status, _ := send(t, "GET", f.url+path, "Host", "node7.example:7480"); status != http.StatusOK {
			t.Errorf("GET %s without a token = %d, want 200", path, status)
		}
	}
	for _, path := range []string{"/api/v1/stats", "/metrics"} {
		if status, _ := send(t, "GET", f.url+path, append(good, "Host", "node7.example:7480")...); status != http.StatusOK {
			t.Errorf("GET %s with the token = %d, want 200", path, status)
		}
	}
	// The controller's token opens the cluster endpoints, and only those.
	for _, tok := range []string{"ctl-secret", "adm-secret"} {
		if status, body := send(t, "POST", f.url+"/api/v1/cluster/resync", "Authorization", "Bearer "+tok); status != http.StatusAccepted {
			t.Errorf("resync with %s = %d %s, want 202", tok, status, body)
		}
	}
	if status, _ := send(t, "POST", f.url+"/api/v1/cluster/resync"); status != http.StatusUnauthorized || resyncs.Load() != 2 {
		t.Errorf("resync without a token = %d; %d resyncs ran, want 2", status, resyncs.Load())
	}
	// The token itself is never shown.
	status, body := send(t, "GET", f.url+"/api/v1/config", good...)
	if status != 200 || strings.Contains(body, "adm-secret") || strings.Contains(body, "ctl-secret") ||
		!strings.Contains(body, `"admin_token": "REDACTED"`) {
		t.Errorf("config = %d %s", status, body)
	}
	if status, _ := send(t, "POST", f.url+"/api/v1/clear", good...); status != http.StatusOK || f.ramObjects() != 0 {
		t.Errorf("clear with the token = %d; RAM holds %d", status, f.ramObjects())
	}
}

func TestReadOpenLeavesMutationsGuarded(t *testing.T) {
	cfg := config.Default()
	cfg.AdminToken, cfg.AdminReadOpen = "adm-secret", true
	f := newFixture(t, cfg)
	for _, path := range []string{"/api/v1/stats", "/api/v1/config", "/api/v1/keys", "/api/v1/scopes", "/metrics"} {
		if status, _ := send(t, "GET", f.url+path); status != http.StatusOK {
			t.Errorf("GET %s with admin_read_open = %d, want 200", path, status)
		}
	}
	for _, path := range []string{"/api/v1/clear", "/api/v1/flush", "/api/v1/cluster/clear", "/api/v1/cluster/drop"} {
		if status, _ := send(t, "POST", f.url+path); status != http.StatusUnauthorized {
			t.Errorf("POST %s with admin_read_open = %d, want 401", path, status)
		}
	}
}

func TestListenRefusesAnOpenBind(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0"} {
		cfg := config.Default()
		cfg.AdminAddr = addr
		a, err := New(nil, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		ln, _, err := a.Listen()
		if err == nil {
			ln.Close()
			t.Fatalf("admin_addr %s without a token listened", addr)
		}
		if !strings.Contains(err.Error(), "admin_token") || !strings.Contains(err.Error(), "beyond loopback") {
			t.Errorf("error %q does not name admin_token", err)
		}
		cfg.AdminToken = "t"
		if a, err = New(nil, cfg, nil); err != nil {
			t.Fatal(err)
		}
		ln, _, err = a.Listen()
		if err != nil {
			t.Fatalf("admin_addr %s with a token: %v", addr, err)
		}
		ln.Close()
	}
}

// TestTLSListener serves the admin API over TLS with a certificate made
// at test time and checks that the client sees it, that plain HTTP gets no
// answer from the API, and that a replaced certificate is served after a
// reload.
func TestTLSListener(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "kvtier test CA")
	cert, key := ca.WriteServer(t, dir, "admin")
	cfg := config.Default()
	cfg.AdminAddr, cfg.AdminTLSCert, cfg.AdminTLSKey = "127.0.0.1:0", cert, key
	var logs bytes.Buffer
	a, err := New(newFixture(t, config.Default()).eng, cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ln, tr, err := a.Listen()
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: a.Handler()}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	addr := ln.Addr().String()

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: ca.ClientConfig()}}
	resp, err := client.Get("https://" + addr + "/api/v1/stats")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET over TLS = %d", resp.StatusCode)
	}
	if resp, err := http.Get("http://" + addr + "/api/v1/stats"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain HTTP was served the stats")
		}
	}
	// A client that does not trust the CA refuses the certificate.
	if _, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{}}}).Get("https://" + addr + "/healthz"); err == nil {
		t.Error("a client without the CA accepted the certificate")
	}
	newCert, newKey := ca.WriteServer(t, dir, "admin-renewed")
	for _, mv := range [][2]string{{newCert, cert}, {newKey, key}} {
		if err := renameFile(mv[0], mv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.Reload(); err != nil {
		t.Fatal(err)
	}
	if cn := tlstest.PeerCN(t, addr, ca.ClientConfig()); cn != "admin-renewed" {
		t.Errorf("after reload the admin API serves %q", cn)
	}
}

func renameFile(from, to string) error { return os.Rename(from, to) }
