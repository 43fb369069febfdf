// Package api serves kvtier's KV-aware router over HTTP/JSON: a gateway posts
// a prompt's token ids to POST /v1/score and gets back, for each pod, how much
// of the prompt's prefix that pod already holds in its KV cache.
//
// The handler reproduces the engine's prefix-cache keys: it cuts the tokens
// into blocks, hashes them exactly as vLLM does (chunk.VLLMHasher with the
// pods' PYTHONHASHSEED, the request's LoRA name and cache salt), reduces each
// hash to the 64-bit form vLLM's KV events carry (chunk.EventHash) and to
// the index key of the request's KV-cache group (index.GroupKey), and asks
// an index.Scorer to score the pods over router/index, which router/ingest
// fills from those events. The keys therefore match only when the pods run
// with the same PYTHONHASHSEED, block size and --prefix-caching-hash-algo
// sha256_cbor.
//
// Scoring reuses per-request scratch buffers from a sync.Pool, so hashing and
// scoring a prompt cost no heap allocation per block; only decoding the JSON
// request and encoding the response allocate.
//
// Prompt strings are tokenized in process with the model's tokenizer
// (Config.Tokenizers, package router/tokenize). Pods known to serve another
// model than the request's are not scored.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"kvtier/router/tokenize"
	"log/slog"
	"net/http"
	"sync"

	"kvtier/chunk"
	"kvtier/router/index"
)

// Defaults for Config.
const (
	DefaultMaxTokens    = 131072
	DefaultMaxBodyBytes = 4 << 20
)

// ErrConfig reports an unusable Config.
var ErrConfig = errors.New("api: bad config")

// Config configures a Handler.
type Config struct {
	Index  index.Store       // required
	Pods   *index.Pods       // required; names the index's pod ids
	Hasher *chunk.VLLMHasher // required; the pods' PYTHONHASHSEED and block size
	// Scorer scores pods; nil means index.LongestPrefix.
	Scorer index.Scorer
	// MaxTokens bounds a request's tokens; 0 means DefaultMaxTokens.
	MaxTokens int
	// MaxBodyBytes bounds a request body; 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Tokenizers turns prompt strings into tokens, by model; nil (or a
	// model it returns nil for) refuses prompt requests with a clear error.
	Tokenizers func(model string) *tokenize.Pool
	// Log receives request errors at debug level; nil discards them.
	Log *slog.Logger
}

// ScoreRequest is the body of POST /v1/score.
type ScoreRequest struct {
	Model  string   `json:"model"`
	Tokens []uint32 `json:"tokens"`
	// Pods is the candidate set; empty scores every pod holding a block.
	Pods      []string `json:"pods,omitempty"`
	LoRAName  string   `json:"lora_name,omitempty"`
	CacheSalt string   `json:"cache_salt,omitempty"`
	// Prompt is the prompt as text, tokenized with the model's tokenizer
	// (Config.Tokenizers); give Prompt or Tokens, not both.
	Prompt *string `json:"prompt,omitempty"`
	// AddSpecialTokens asks for the tokens the tokenizer adds around a
	// text (BOS, for Llama 3 style tokenizers), as vLLM does for a
	// completion request's prompt. Off by default: a prompt rendered with
	// a chat template already carries them, and vLLM's chat endpoint adds
	// none. Only used with Prompt.
	AddSpecialTokens bool `json:"add_special_tokens,omitempty"`
	// Group is the KV-cache group to score (vLLM's group_idx; see
	// index.GroupKey): 0, the default, is a non-hybrid model's only group
	// and what events without a group_idx report. A hybrid model's groups
	// are scored one at a time.
	Group int `json:"group_idx,omitempty"`
}

// ScoreResponse is the answer of POST /v1/score. Scores holds every
// candidate when the request named some (0 for unknown pods), otherwise
// every pod that scored above 0. Blocks is the number of full blocks the
// tokens make.
type ScoreResponse struct {
	Scores map[string]float64 `json:"scores"`
	Blocks int                `json:"blocks"`
}

// errorResponse is the body of every 4xx/5xx answer.
type errorResponse struct {
	Error string `json:"error"`
}

// Handler serves /v1/score and /healthz. It is safe for concurrent use.
type Handler struct {
	ix        index.Store
	pods      *index.Pods
	hasher    *chunk.VLLMHasher
	scorer    index.Scorer
	maxTokens int
	maxBody   int64
	tokenizer func(model string) *tokenize.Pool
	log       *slog.Logger
	scratch   sync.Pool // of *scratch
	mux       *http.ServeMux
}

// scratch holds one request's reusable buffers.
type scratch struct {
	req        ScoreRequest
	blocks     [][32]byte
	hashes     []uint64
	candidates []index.PodID
	scores     []index.PodScore
}

// New returns a Handler for cfg.
func New(cfg Config) (*Handler, error) {
	if cfg.Index == nil || cfg.Pods == nil || cfg.Hasher == nil {
		return nil, fmt.Errorf("%w: Index, Pods and Hasher are required", ErrConfig)
	}
	if cfg.MaxTokens < 0 || cfg.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("%w: negative MaxTokens %d or MaxBodyBytes %d", ErrConfig, cfg.MaxTokens, cfg.MaxBodyBytes)
	}
	h := &Handler{
		ix:        cfg.Index,
		pods:      cfg.Pods,
		hasher:    cfg.Hasher,
		scorer:    cfg.Scorer,
		maxTokens: cfg.MaxTokens,
		maxBody:   cfg.MaxBodyBytes,
		tokenizer: cfg.Tokenizers,
		log:       cfg.Log,
	}
	if h.scorer == nil {
		h.scorer = index.LongestPrefix{}
	}
	if h.maxTokens == 0 {
		h.maxTokens = DefaultMaxTokens
	}
	if h.maxBody == 0 {
		h.maxBody = DefaultMaxBodyBytes
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	h.scratch.New = func() any { return new(scratch) }
	h.mux = http.NewServeMux()
	h.mux.HandleFunc("/v1/score", h.serveScore)
	h.mux.HandleFunc("/healthz", h.serveHealth)
	return h, nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

func (h *Handler) serveHealth(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, "GET, HEAD")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, `{"status":"ok"}`+"\n")
}

func (h *Handler) serveScore(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, http.MethodPost)
		return
	}
	s := h.scratch.Get().(*scratch)
	defer h.scratch.Put(s)

	body := http.MaxBytesReader(w, r.Body, h.maxBody)
	err := decodeRequest(body, &s.req, h.maxTokens)
	if err == nil {
		err = h.tokenize(r.Context(), s)
	}
	if err != nil {
		status := http.StatusBadRequest
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			status = http.StatusRequestEntityTooLarge
		}
		h.log.Debug("bad score request", "status", status, "err", err)
		writeJSON(w, status, errorResponse{Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, h.respond(s))
}

// ErrInvalid marks a request the API refuses (a bad field, no tokenizer
// for the model, too many tokens); Score wraps it.
var ErrInvalid = errors.New("api: invalid score request")

// Score scores req as POST /v1/score would, for callers in Go such as the
// gRPC service. Errors about the request wrap ErrInvalid.
func (h *Handler) Score(ctx context.Context, req ScoreRequest) (ScoreResponse, error) {
	s := h.scratch.Get().(*scratch)
	defer h.scratch.Put(s)
	s.req = req
	s.req.Tokens = append(s.req.Tokens[:0:0], req.Tokens...)
	if err := validateRequest(&s.req, h.maxTokens); err != nil {
		return ScoreResponse{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := h.tokenize(ctx, s); err != nil {
		if ctx.Err() != nil {
			return ScoreResponse{}, ctx.Err()
		}
		return ScoreResponse{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return h.respond(s), nil
}

// tokenize turns a prompt request into tokens with the model's tokenizer.
func (h *Handler) tokenize(ctx context.Context, s *scratch) error {
	if s.req.Prompt == nil {
		return nil
	}
	var pool *tokenize.Pool
	if h.tokenizer != nil {
		pool = h.tokenizer(s.req.Model)
	}
	if pool == nil {
		return fmt.Errorf("no tokenizer is configured for model %.200q: send tokens (token ids), or start the controller with --tokenizer", s.req.Model)
	}
	encode := pool.Encode
	if s.req.AddSpecialTokens {
		encode = pool.EncodeSpecial
	}
	toks, err := encode(ctx, *s.req.Prompt, s.req.Tokens[:0])
	if err != nil {
		return fmt.Errorf("tokenizing the prompt: %w", err)
	}
	s.req.Tokens = toks
	switch {
	case len(toks) == 0:
		return errors.New("the prompt has no tokens")
	case len(toks) > h.maxTokens:
		return fmt.Errorf("too many tokens: the prompt makes %d, at most %d", len(toks), h.maxTokens)
	}
	return nil
}

// respond scores s.req and names the pods.
func (h *Handler) respond(s *scratch) ScoreResponse {
	resp := ScoreResponse{Scores: make(map[string]float64, len(s.req.Pods))}
	s.candidates = s.candidates[:0]
	for _, name := range s.req.Pods {
		if _, dup := resp.Scores[name]; dup {
			continue // a scorer scores each candidate once
		}
		resp.Scores[name] = 0
		if id, ok := h.pods.ID(name); ok {
			s.candidates = append(s.candidates, id)
		}
	}
	candidates := s.candidates
	restricted := len(s.req.Pods) > 0 // only some pods may score
	if !restricted {
		// Every pod serving the model; nil (every pod) while no pod's
		// model is known, as with a static fleet of one model.
		var known bool
		s.candidates, known = h.pods.ServingModel(s.req.Model, s.candidates[:0])
		candidates, restricted = nil, known
		if known {
			candidates = s.candidates
		}
	} else {
		candidates = h.sameModel(s.req.Model, candidates)
	}
	// No pod can score (named pods unknown or of another model, or a model
	// no pod serves): every score is 0, and nothing is hashed. The test is
	// on restricted, not on candidates being nil: an empty slice may well
	// be nil, and nil means "every pod" to a scorer.
	if restricted && len(candidates) == 0 {
		resp.Blocks = len(s.req.Tokens) / h.hasher.BlockSize()
		return resp
	}
	resp.Blocks = h.score(s, candidates)
	for _, ps := range s.scores {
		if name, ok := h.pods.Name(ps.Pod); ok {
			resp.Scores[name] = ps.Score
		}
	}
	return resp
}

// sameModel drops from candidates the pods known to serve another model
// (in place). Named pods of another model keep their 0 in the response.
func (h *Handler) sameModel(model string, candidates []index.PodID) []index.PodID {
	out := candidates[:0]
	for _, id := range candidates {
		if m := h.pods.Model(id); m == "" || m == model {
			out = append(out, id)
		}
	}
	return out
}

// score hashes s.req's tokens into s.hashes and scores candidates (nil:
// every pod) into s.scores. It reports the number of blocks. With warm
// scratch buffers it does not allocate.
func (h *Handler) score(s *scratch, candidates []index.PodID) int {
	req := chunk.VLLMRequest{LoRAName: s.req.LoRAName, CacheSalt: s.req.CacheSalt}
	s.blocks = h.hasher.BlockHashes(s.blocks[:0], s.req.Tokens, req)
	s.hashes = s.hashes[:0]
	for i := range s.blocks {
		s.hashes = append(s.hashes, chunk.EventHash(s.blocks[i]))
	}
	index.GroupKeys(s.hashes, s.req.Group)
	var ix index.Store = h.ix
	if snap, ok := h.ix.(index.Snapshotter); ok {
		// One read of the whole prompt instead of one per block; a failed
		// read scores as an empty index (the store counts the failure).
		ix, _ = snap.Snapshot(s.hashes)
	}
	s.scores = h.scorer.Score(ix, s.hashes, candidates, s.scores[:0])
	return len(s.hashes)
}

// decodeRequest reads one ScoreRequest from r into req, reusing req's token
// buffer, and validates it. Errors name what was wrong.
func decodeRequest(r io.Reader, req *ScoreRequest, maxTokens int) error {
	*req = ScoreRequest{Tokens: req.Tokens[:0]}
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(req); err != nil {
		return fmt.Errorf("decoding request: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return fmt.Errorf("decoding request: %w", err)
		}
		return errors.New("decoding request: trailing data after the JSON object")
	}
	return validateRequest(req, maxTokens)
}

// validateRequest checks a decoded request's fields.
func validateRequest(req *ScoreRequest, maxTokens int) error {
	switch {
	case req.Model == "":
		return errors.New("model is required")
	case req.Prompt != nil && len(req.Tokens) > 0:
		return errors.New("give prompt or tokens, not both")
	case req.Prompt == nil && len(req.Tokens) == 0:
		return errors.New("tokens are required (a non-empty array of token ids), or a prompt")
	case len(req.Tokens) > maxTokens:
		return fmt.Errorf("too many tokens: %d, at most %d", len(req.Tokens), maxTokens)
	case req.Prompt != nil && len(*req.Prompt) > 16*maxTokens:
		return fmt.Errorf("prompt of %d bytes is too long", len(*req.Prompt))
	case req.AddSpecialTokens && req.Prompt == nil:
		return errors.New("add_special_tokens applies to a prompt, not to tokens")
	case !index.ValidGroup(req.Group):
		return fmt.Errorf("group_idx %d out of range 0..%d", req.Group, index.MaxGroup)
	}
	for _, p := range req.Pods {
		if p == "" {
			return errors.New("pods: empty pod name")
		}
	}
	return nil
}

func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	writeJSON(w, http.StatusMethodNotAllowed, errorResponse{Error: "method not allowed; use " + allow})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// An encoding error here is a client gone away; nothing to do.
	_ = json.NewEncoder(w).Encode(v)
}
