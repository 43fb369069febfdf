package controller

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"kvtier/internal/servetest"
	"kvtier/internal/tlstest"
)

var grpcListening = regexp.MustCompile(`msg="grpc listening" addr=(\S+) tls=true`)

// TestGRPCAndProxyTLS serves grpc_listen and proxy_listen over TLS from
// certificates made at test time: a gRPC client trusting the CA reaches
// the gRPC service, a plaintext one does not; the proxy answers HTTPS
// only; and a certificate replaced in place is served by the next
// handshakes, without a restart.
func TestGRPCAndProxyTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "kvtier test CA")
	p1, d1 := newFakeEngine(t, "p1", "prefill"), newFakeEngine(t, "d1", "decode")
	cfg := validConfig()
	cfg.GRPCListen, cfg.ProxyListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.PrefillInstances, cfg.DecodeInstances = []string{p1.spec()}, []string{d1.spec()}
	cfg.GRPCTLSCert, cfg.GRPCTLSKey = ca.WriteServer(t, dir, "grpc")
	cfg.ProxyTLSCert, cfg.ProxyTLSKey = ca.WriteServer(t, dir, "proxy")
	logs := &servetest.Log{}
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan error, 1)
	go func() { exited <- Run(ctx, func() {}, cfg, logs) }()
	t.Cleanup(func() { cancel(); <-exited })
	waitListening(t, logs, exited)
	grpcAddr := grpcListening.FindStringSubmatch(logs.String())
	if grpcAddr == nil {
		t.Fatalf("no TLS gRPC listener logged:\n%s", logs)
	}
	proxyAddr := strings.TrimPrefix(waitProxy(t, logs), "http://")

	// Over TLS the call reaches the gRPC server, which knows no such
	// method: Unimplemented is an answer from the server itself.
	if code := grpcCall(t, grpcAddr[1], credentials.NewTLS(ca.ClientConfig())); code != codes.Unimplemented {
		t.Errorf("gRPC over TLS: %v, want Unimplemented from the server", code)
	}
	if code := grpcCall(t, grpcAddr[1], insecure.NewCredentials()); code != codes.Unavailable {
		t.Errorf("plaintext gRPC to a TLS listener: %v, want Unavailable", code)
	}

	https := &http.Client{Transport: &http.Transport{TLSClientConfig: ca.ClientConfig()}}
	resp, err := https.Post("https://"+proxyAddr+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Kvtier-Decode") != "d1" {
		t.Errorf("proxy over TLS: status %d, decode %q", resp.StatusCode, resp.Header.Get("X-Kvtier-Decode"))
	}
	if resp, err := http.Get("http://" + proxyAddr + "/v1/models"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Error("plain HTTP reached a TLS proxy")
		}
	}

	// Replace both pairs in place (by rename, as certificate managers do).
	for _, l := range []struct{ addr, cert, key, cn string }{
		{grpcAddr[1], cfg.GRPCTLSCert, cfg.GRPCTLSKey, "grpc-renewed"},
		{proxyAddr, cfg.ProxyTLSCert, cfg.ProxyTLSKey, "proxy-renewed"},
	} {
		cert, key := ca.WriteServer(t, t.TempDir(), l.cn)
		for _, f := range [][2]string{{cert, l.cert}, {key, l.key}} {
			data, err := os.ReadFile(f[0])
			if err != nil {
				t.Fatal(err)
			}
			tlstest.WriteFile(t, f[1], data)
		}
		deadline := time.Now().Add(hang)
		for tlstest.PeerCN(t, l.addr, ca.ClientConfig()) != l.cn {
			if time.Now().After(deadline) {
				t.Fatalf("%s still serves its old certificate:\n%s", l.addr, logs)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// grpcCall makes one call of a method no server has and returns its code.
func grpcCall(t *testing.T, addr string, creds credentials.TransportCredentials) codes.Code {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out struct{}
	err = conn.Invoke(ctx, "/kvtier.test.NoService/NoMethod", &struct{}{}, &out, grpc.ForceCodec(emptyCodec{}))
	return status.Code(err)
}

// emptyCodec encodes nothing: the call needs no message to be answered.
type emptyCodec struct{}

func (emptyCodec) Marshal(any) ([]byte, error) { return nil, nil }
func (emptyCodec) Unmarshal([]byte, any) error { return nil }
func (emptyCodec) Name() string                { return "proto" }

func TestListenerTLSValidation(t *testing.T) {
	for name, c := range map[string]struct {
		mutate func(*Config)
		want   string
	}{
		"grpc key missing":     {func(c *Config) { c.GRPCListen, c.GRPCTLSCert = ":0", "/c" }, "grpc_tls_cert and grpc_tls_key go together"},
		"grpc without listen":  {func(c *Config) { c.GRPCTLSCert, c.GRPCTLSKey = "/c", "/k" }, "grpc_listen is not"},
		"proxy key missing":    {func(c *Config) { c.ProxyTLSKey = "/k" }, "proxy_tls_cert and proxy_tls_key go together"},
		"proxy without listen": {func(c *Config) { c.ProxyTLSCert, c.ProxyTLSKey = "/c", "/k" }, "proxy_listen is not"},
	} {
		cfg := validConfig()
		c.mutate(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}

// TestListenerTLSBadPair: a pair that does not load stops the start with
// an error naming the key.
func TestListenerTLSBadPair(t *testing.T) {
	cfg := validConfig()
	cfg.GRPCListen = "127.0.0.1:0"
	cfg.GRPCTLSCert, cfg.GRPCTLSKey = filepath.Join(t.TempDir(), "none.crt"), filepath.Join(t.TempDir(), "none.key")
	err := Run(context.Background(), func() {}, cfg, &servetest.Log{})
	if err == nil || !strings.Contains(err.Error(), "grpc_tls_cert") {
		t.Fatalf("Run with a missing gRPC certificate: %v", err)
	}
}
