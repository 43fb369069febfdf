package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestProbe checks each outcome of `kvtier healthcheck` against real HTTP
// servers on loopback: a 2xx passes, any other status, a closed port, a
// server that never answers and a malformed URL fail.
func TestProbe(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) }))
	defer ok.Close()
	draining := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "draining", http.StatusServiceUnavailable)
	}))
	defer draining.Close()
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	defer hung.Close()
	defer close(release)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/healthz"
	ln.Close()

	var out bytes.Buffer
	if err := probe(context.Background(), ok.URL+"/healthz", time.Second, &out); err != nil {
		t.Fatalf("200: %v", err)
	}
	if !strings.Contains(out.String(), "200") {
		t.Errorf("output %q does not name the status", out.String())
	}
	for name, c := range map[string]struct {
		url  string
		want string
	}{
		"503":       {draining.URL + "/readyz", "503"},
		"closed":    {closed, "refused"},
		"hung":      {hung.URL, "deadline"},
		"scheme":    {"ftp://127.0.0.1/", "want http"},
		"no host":   {"http:///healthz", "want http"},
		"malformed": {"http://[::1", "want http"},
	} {
		err := probe(context.Background(), c.url, 200*time.Millisecond, &out)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error with %q", name, err, c.want)
		}
	}
	if err := probe(context.Background(), ok.URL, 0, &out); err == nil {
		t.Error("timeout 0 accepted")
	}
}

// TestHealthcheckFlags checks the command accepts the flags the Dockerfile
// and the Helm chart pass it.
func TestHealthcheckFlags(t *testing.T) {
	cmd := healthcheckCmd()
	if err := cmd.ParseFlags([]string{"--url", defaultHealthURL, "--timeout", "2s"}); err != nil {
		t.Fatal(err)
	}
	if got := cmd.Flags().Lookup("url").Value.String(); got != defaultHealthURL {
		t.Errorf("--url = %q", got)
	}
}
