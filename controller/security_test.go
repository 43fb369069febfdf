package controller

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"kvtier/internal/servetest"
	"kvtier/internal/tlstest"
)

// runController runs a controller with cfg until the test ends and
// returns its address (host:port) and log.
func runController(t *testing.T, cfg Config) (string, *servetest.Log) {
	t.Helper()
	logs := &servetest.Log{}
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan error, 1)
	go func() { exited <- Run(ctx, func() {}, cfg, logs) }()
	t.Cleanup(func() { cancel(); <-exited })
	return strings.TrimPrefix(waitListening(t, logs, exited), "http://"), logs
}

func request(t *testing.T, client *http.Client, method, url string, headers ...string) int {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == "Host" {
			req.Host = headers[i+1]
		} else {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestClusterAPIRefusesBrowsersAndRebinding: without a token, the
// controller's cluster API answers loopback clients, but not a foreign
// web page's POST nor a request naming a foreign host; the score API and
// the health check stay open.
func TestClusterAPIRefusesBrowsersAndRebinding(t *testing.T) {
	cfg := validConfig()
	cfg.Pods = nil
	addr, logs := runController(t, cfg)
	base := "http://" + addr
	c := http.DefaultClient
	if got := request(t, c, "POST", base+"/v1/cluster/deregister", "Origin", "http://evil.example"); got != http.StatusForbidden {
		t.Errorf("cross-origin deregister = %d, want 403", got)
	}
	if got := request(t, c, "POST", base+"/v1/cluster/ops", "Sec-Fetch-Site", "cross-site"); got != http.StatusForbidden {
		t.Errorf("cross-site op = %d, want 403", got)
	}
	if got := request(t, c, "GET", base+"/v1/cluster/instances", "Host", "rebind.evil.example"); got != http.StatusForbidden {
		t.Errorf("instances with a foreign Host = %d, want 403", got)
	}
	if got := request(t, c, "GET", base+"/v1/cluster/instances"); got != http.StatusOK {
		t.Errorf("instances from loopback = %d, want 200", got)
	}
	if got := request(t, c, "GET", base+"/healthz", "Host", "node.example"); got != http.StatusOK {
		t.Errorf("/healthz = %d, want 200", got)
	}
	if !strings.Contains(logs.String(), "cluster request refused") {
		t.Errorf("refusals not logged:\n%s", logs)
	}
}

// TestControllerTLS serves the controller over TLS from files made at
// test time: a client trusting the CA reaches the cluster API with the
// token, a plain HTTP client does not get the API.
func TestControllerTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "kvtier test CA")
	cfg := validConfig()
	cfg.Pods, cfg.ClusterToken = nil, "tok"
	cfg.TLSCert, cfg.TLSKey = ca.WriteServer(t, dir, "controller")
	addr, _ := runController(t, cfg)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: ca.ClientConfig()}}
	if got := request(t, client, "GET", "https://"+addr+"/v1/cluster/instances", "Authorization", "Bearer tok"); got != http.StatusOK {
		t.Errorf("instances over TLS = %d", got)
	}
	if got := request(t, client, "GET", "https://"+addr+"/v1/cluster/instances"); got != http.StatusUnauthorized {
		t.Errorf("instances over TLS without the token = %d, want 401", got)
	}
	if got := request(t, http.DefaultClient, "GET", "http://"+addr+"/v1/cluster/instances", "Authorization", "Bearer tok"); got == http.StatusOK {
		t.Error("plain HTTP reached the cluster API of a TLS controller")
	}
	if cn := tlstest.PeerCN(t, addr, ca.ClientConfig()); cn != "controller" {
		t.Errorf("serving %q", cn)
	}
}

func TestControllerTLSNeedsBothFiles(t *testing.T) {
	cfg := validConfig()
	cfg.TLSCert = "/some/cert.pem"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "tls_cert") {
		t.Errorf("tls_cert without tls_key: %v", err)
	}
}
