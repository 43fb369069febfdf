package controller

import (
	"fmt"
	"net"

	"kvtier/internal/tlsreload"
	"kvtier/router/api"
	"kvtier/router/grpcapi"
)

// startGRPC serves the gRPC API on addr until stop is called.
// GetPodScores scores like POST /v1/score, after tokenizing the prompt as
// llm-d does (opts).
// With tr, it serves TLS only, with tr's current certificate.
func startGRPC(addr string, h *api.Handler, opts grpcapi.ScorerOptions, tr *tlsreload.Reloader) (net.Addr, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", which("grpc_listen"), err)
	}
	srv := grpcapi.NewServer(grpcapi.NewHandlerScorer(h, opts), grpcCreds(tr)...)
	go srv.Serve(ln)
	return ln.Addr(), srv.GracefulStop, nil
}
