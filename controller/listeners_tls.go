package controller

import (
	"crypto/tls"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"kvtier/internal/tlsreload"
)

// TLS of the gRPC and proxy listeners: each has its own certificate pair
// (grpc_tls_cert, proxy_tls_cert), reread on SIGHUP and when the files
// change, as the HTTP listener's tls_cert (docs/security.md#tls). Their
// own pairs, rather than tls_cert's, because their clients differ: the
// gateway's endpoint picker on gRPC, OpenAI clients on the proxy.

// validateListenerTLS checks that each pair is whole and that its
// listener is configured.
func (c Config) validateListenerTLS(bad func(key, format string, args ...any)) {
	for _, p := range []struct{ cert, key, certName, keyName, listen, listenName string }{
		{c.GRPCTLSCert, c.GRPCTLSKey, "grpc_tls_cert", "grpc_tls_key", c.GRPCListen, "grpc_listen"},
		{c.ProxyTLSCert, c.ProxyTLSKey, "proxy_tls_cert", "proxy_tls_key", c.ProxyListen, "proxy_listen"},
	} {
		switch {
		case (p.cert == "") != (p.key == ""):
			bad(p.certName, "%s and %s go together; only one is set", p.certName, p.keyName)
		case p.cert != "" && p.listen == "":
			bad(p.certName, "set, but %s is not: there is no listener to serve it on", p.listenName)
		}
	}
}

// loadListenerTLS loads the gRPC and proxy listeners' certificates; an
// error names the key whose pair does not load.
func (c *controller) loadListenerTLS() error {
	var err error
	if c.cfg.GRPCTLSCert != "" {
		if c.grpcTLS, err = tlsreload.New(which("grpc_tls_cert"), c.cfg.GRPCTLSCert, c.cfg.GRPCTLSKey, c.log); err != nil {
			return err
		}
	}
	if c.cfg.ProxyTLSCert != "" {
		if c.proxyTLS, err = tlsreload.New(which("proxy_tls_cert"), c.cfg.ProxyTLSCert, c.cfg.ProxyTLSKey, c.log); err != nil {
			return err
		}
	}
	return nil
}

// withTLS wraps ln to serve TLS only with tr's current certificate; ln as
// is when tr is nil.
func withTLS(ln net.Listener, tr *tlsreload.Reloader) net.Listener {
	if tr == nil {
		return ln
	}
	return tls.NewListener(ln, tr.Config())
}

// grpcCreds returns the server option that makes gRPC serve TLS with tr's
// current certificate (credentials.NewTLS adds the h2 protocol that gRPC
// clients insist on negotiating), or none when tr is nil.
func grpcCreds(tr *tlsreload.Reloader) []grpc.ServerOption {
	if tr == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(tr.Config()))}
}
