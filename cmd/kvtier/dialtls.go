package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// dialTLS returns the TLS configuration this daemon dials other daemons'
// TCP protocol with: nil (plain TCP) without tcp_tls_ca, else one that
// trusts the certificate authorities in that PEM file alone.
func dialTLS(caFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("tcp_tls_ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tcp_tls_ca: %s holds no PEM certificate", caFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
