package controller

import (
	"fmt"
	"net"

	"kvtier/router/api"
	"kvtier/router/grpcapi"
)

// startGRPC serves the gRPC API on addr until stop is called.
// GetPodScores scores like POST /v1/score, after tokenizing the prompt as
// llm-d does (opts).
func startGRPC(addr string, h *api.Handler, opts grpcapi.ScorerOptions) (net.Addr, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", which("grpc_listen"), err)
	}
	srv := grpcapi.NewServer(grpcapi.NewHandlerScorer(h, opts))
	go srv.Serve(ln)
	return ln.Addr(), srv.GracefulStop, nil
}
