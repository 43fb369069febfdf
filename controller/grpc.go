package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"

	"kvtier/router/api"
	"kvtier/router/grpcapi"
)

// grpcScorer answers llm-d's GetPodScores with the same scoring as
// POST /v1/score: the prompt is tokenized with the model's tokenizer.
type grpcScorer struct{ h *api.Handler }

// ScorePrompt implements grpcapi.Scorer.
func (s grpcScorer) ScorePrompt(ctx context.Context, model, prompt string, pods []string) ([]grpcapi.PodScore, error) {
	resp, err := s.h.Score(ctx, api.ScoreRequest{Model: model, Prompt: &prompt, Pods: pods})
	if errors.Is(err, api.ErrInvalid) {
		return nil, fmt.Errorf("%w: %v", grpcapi.ErrInvalid, err)
	}
	if err != nil {
		return nil, err
	}
	out := make([]grpcapi.PodScore, 0, len(resp.Scores))
	for pod, score := range resp.Scores {
		out = append(out, grpcapi.PodScore{Pod: pod, Score: score})
	}
	// Highest first, then by name, so answers are stable.
	slices.SortFunc(out, func(a, b grpcapi.PodScore) int {
		if a.Score != b.Score {
			if a.Score > b.Score {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Pod, b.Pod)
	})
	return out, nil
}

// startGRPC serves the gRPC API on addr until stop is called.
func startGRPC(addr string, h *api.Handler) (net.Addr, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", which("grpc_listen"), err)
	}
	srv := grpcapi.NewServer(grpcScorer{h})
	go srv.Serve(ln)
	return ln.Addr(), srv.GracefulStop, nil
}
