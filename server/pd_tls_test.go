package server_test

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"kvtier/client"
	"kvtier/engine"
	"kvtier/internal/tlstest"
	"kvtier/server"
)

// startTLSConsumer serves an engine whose TCP protocol requires TLS with
// a certificate of ca, and returns its address and a client of it.
func startTLSConsumer(t *testing.T, ca *tlstest.CA) (string, *client.Client) {
	t.Helper()
	certFile, keyFile := ca.WriteServer(t, t.TempDir(), "consumer")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.Open(engine.Options{ChunkSize: pChunkTokens, RAMBytes: 16 << 20, Policy: "LRU", SaveUnfull: true})
	if err != nil {
		t.Fatal(err)
	}
	svc := server.NewService(eng, server.ServiceOptions{Token: testToken})
	ln, err := svc.ListenTCP("127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- svc.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := svc.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		<-served
		eng.Close()
	})
	addr := ln.Addr().String()
	conf := ca.ClientConfig()
	conf.ServerName = "127.0.0.1"
	c, err := client.DialTCP(context.Background(), addr, client.Options{Token: testToken, Name: t.Name(), TLS: conf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return addr, c
}

// TestPushOverTLS: a producer given the consumers' CA (tcp_tls_ca) pushes
// to a consumer that requires TLS, and the bytes arrive intact; one
// without it, or trusting another CA, fails the transfer instead.
func TestPushOverTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "fleet")
	addr, cc := startTLSConsumer(t, ca)
	ctx := context.Background()
	cases := []struct {
		name  string
		tls   *tls.Config
		fails string // in the failed transfer's message; "" if it succeeds
	}{
		{"trusted CA", ca.ClientConfig(), ""},
		{"plain TCP", nil, "pushing to"},
		{"other CA", tlstest.NewCA(t, "other").ClientConfig(), "certificate"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prod := startService(t, 16<<20, server.ServiceOptions{PDPushTLS: tc.tls})
			keys := pdKeys(3, byte(60+i))
			storeRaw(t, prod.remote(t), keys, uint32(60+i), pChunkBytes)
			pc := prod.local(t)
			if _, err := pc.Push(ctx, 1, addr, client.Raw(keys), 0, true); err != nil {
				t.Fatal(err)
			}
			st := waitPushed(t, pc, 1)
			if tc.fails != "" {
				if st.Message == "" || !strings.Contains(st.Message, tc.fails) || st.Pushed != 0 {
					t.Fatalf("transfer %+v, want it failed with %q and nothing pushed", st, tc.fails)
				}
				t.Logf("failed as expected: %s", st.Message)
				return
			}
			if st.Pushed != uint32(len(keys)) || st.Message != "" {
				t.Fatalf("transfer %+v", st)
			}
			checkRaw(t, cc, keys, uint32(60+i), pChunkBytes)
		})
	}
}
