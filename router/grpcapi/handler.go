package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"kvtier/router/api"
)

// ScorerOptions configure the Scorer NewHandlerScorer returns. The zero
// value behaves as llm-d does.
type ScorerOptions struct {
	// NoSpecialTokens tokenizes the prompt as is. By default the tokens the
	// model's tokenizer adds around a text (tokenizer.json's
	// post_processor: <|begin_of_text|> for Llama 3 style models, nothing
	// for GPT-2 or Qwen 2 style ones) are added, as llm-d does: its
	// GetPodScores renders a bare prompt as a vLLM completion request,
	// whose add_special_tokens defaults to true (before April 2026 its
	// embedded tokenizer encoded with add_special_tokens=true), and vLLM
	// tokenizes the completion the same way, so the block keys match the
	// engine's. Set it for callers that send prompts already rendered with
	// a chat template that writes the BOS itself (vLLM's chat endpoint
	// adds no special tokens). No chat template is applied either way:
	// GetPodScores carries a bare prompt.
	NoSpecialTokens bool
}

// NewHandlerScorer returns a Scorer that answers GetPodScores with the
// router's own scoring (the same as POST /v1/score): the prompt is
// tokenized with the model's tokenizer, then scored over the block index.
// Scores come highest first, then by pod name, so answers are stable.
func NewHandlerScorer(h *api.Handler, opts ScorerOptions) Scorer {
	return handlerScorer{h: h, opts: opts}
}

type handlerScorer struct {
	h    *api.Handler
	opts ScorerOptions
}

// ScorePrompt implements Scorer.
func (s handlerScorer) ScorePrompt(ctx context.Context, model, prompt string, pods []string) ([]PodScore, error) {
	resp, err := s.h.Score(ctx, api.ScoreRequest{Model: model, Prompt: &prompt, Pods: pods,
		AddSpecialTokens: !s.opts.NoSpecialTokens})
	if errors.Is(err, api.ErrInvalid) {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err != nil {
		return nil, err
	}
	out := make([]PodScore, 0, len(resp.Scores))
	for pod, score := range resp.Scores {
		out = append(out, PodScore{Pod: pod, Score: score})
	}
	slices.SortFunc(out, func(a, b PodScore) int {
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
