package controller

// The prefill/decode proxy (docs/disaggregation.md): an OpenAI-compatible endpoint
// that runs each completion in two stages on two vLLM instances. The
// decode instance is chosen first, by load, because the prefill request
// must say where the KV goes: its kvtier daemon. The prefill instance,
// chosen by the KV-aware score, computes the prompt with max_tokens 1 and
// answers kv_transfer_params; the decode instance gets the client's
// request with those params, and its answer (streamed or not) goes back
// to the client byte for byte.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"kvtier/internal/ratelog"
)

// Proxy defaults and bounds.
const (
	DefaultPrefillTimeout = 2 * time.Minute
	DefaultDecodeTimeout  = 10 * time.Minute
	// proxyMaxBody bounds a client's request body; long prompts are a few
	// MiB of JSON at most.
	proxyMaxBody = 32 << 20
	// prefillMaxAnswer bounds the prefill instance's answer, one token
	// plus the connector's params.
	prefillMaxAnswer = 16 << 20
	// upstreamErrorMax bounds an upstream error body kept for the client.
	upstreamErrorMax = 64 << 10
)

// proxyConfig is what the proxy is built from.
type proxyConfig struct {
	Prefill, Decode []string // instance specs (parseUpstreams)
	PrefillTimeout  time.Duration
	DecodeTimeout   time.Duration
	Score           scoreFunc // nil: prefill instances in turn, by load
	Log             *slog.Logger
	Client          *http.Client // nil: a client for many instances
}

// proxy serves /v1/completions, /v1/chat/completions, /v1/models and
// /healthz. It is safe for concurrent use.
type proxy struct {
	prefill, decode *pool
	score           scoreFunc
	hc              *http.Client
	prefillTimeout  time.Duration
	decodeTimeout   time.Duration
	log             *slog.Logger
	noParams        *ratelog.Limiter // per request when the prefill side has no KV connector
	relayErrs       *ratelog.Limiter // per request while an instance is failing
	logs            ratelog.Set      // upstream errors: per request while an instance answers with one
	bufs            sync.Pool        // *[]byte relay buffers
	mux             *http.ServeMux
}

func newProxy(cfg proxyConfig) (*proxy, error) {
	pre, err := parseUpstreams("prefill", cfg.Prefill, false)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", which("prefill"), err)
	}
	dec, err := parseUpstreams("decode", cfg.Decode, true)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", which("decode"), err)
	}
	if len(pre.list) == 0 || len(dec.list) == 0 {
		return nil, fmt.Errorf("%s and %s: the proxy needs at least one of each", which("prefill"), which("decode"))
	}
	p := &proxy{prefill: pre, decode: dec, score: cfg.Score, hc: cfg.Client,
		prefillTimeout: cfg.PrefillTimeout, decodeTimeout: cfg.DecodeTimeout, log: cfg.Log}
	if p.hc == nil {
		p.hc = &http.Client{Transport: &http.Transport{
			Proxy:               nil, // instances are reached directly
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true, // relay the bytes as the engine sent them
		}}
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	// Both can happen on every request: one line, with a count, per 10 s.
	p.noParams = ratelog.New(p.log, slog.LevelWarn,
		"prefill answered no kv_transfer_params; the decode instance computes the prompt", 10*time.Second)
	p.relayErrs = ratelog.New(p.log, slog.LevelWarn, "relay failed", 10*time.Second)
	p.bufs.New = func() any { b := make([]byte, 32<<10); return &b }
	p.mux = http.NewServeMux()
	p.mux.HandleFunc("/v1/completions", func(w http.ResponseWriter, r *http.Request) { p.serveCompletion(w, r, false) })
	p.mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { p.serveCompletion(w, r, true) })
	p.mux.HandleFunc("/v1/models", p.serveModels)
	p.mux.HandleFunc("/healthz", p.serveHealth)
	return p, nil
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.mux.ServeHTTP(w, r) }

func (p *proxy) serveHealth(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		proxyError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method not allowed; use GET", nil)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "prefill": len(p.prefill.list), "decode": len(p.decode.list)})
}

// serveModels answers with a decode instance's model list: every instance
// serves the same models.
func (p *proxy) serveModels(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", "GET")
		proxyError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method not allowed; use GET", nil)
		return
	}
	dec := p.decode.leastLoaded(nil)
	defer dec.inflight.Add(-1)
	ctx, cancel := context.WithTimeout(r.Context(), p.prefillTimeout)
	defer cancel()
	resp, err := p.send(ctx, http.MethodGet, dec.base+"/v1/models", nil, r.Header, "")
	if err != nil {
		p.stageFailed(w, r, ctx, "models", dec, p.prefillTimeout, err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		p.upstreamStatus(w, "models", dec, resp)
		return
	}
	p.relay(w, r, ctx, "models", dec, p.prefillTimeout, resp, false)
}

// serveCompletion runs one completion through both stages.
func (p *proxy) serveCompletion(w http.ResponseWriter, r *http.Request, chat bool) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		proxyError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method not allowed; use POST", nil)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, proxyMaxBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			proxyError(w, http.StatusRequestEntityTooLarge, "invalid_request_error",
				fmt.Sprintf("request body over %d bytes", proxyMaxBody), nil)
			return
		}
		proxyError(w, http.StatusBadRequest, "invalid_request_error", "reading the request body: "+err.Error(), nil)
		return
	}
	req, err := parseCompletion(body)
	if err != nil {
		proxyError(w, http.StatusBadRequest, "invalid_request_error", err.Error(), nil)
		return
	}
	path := "/v1/completions"
	if chat {
		path = "/v1/chat/completions"
	}
	id := newTransferID()
	requestID := r.Header.Get("X-Request-Id")
	if requestID == "" {
		requestID = id
	}

	dec := p.decode.leastLoaded(nil)
	defer dec.inflight.Add(-1)
	kv, pre, ok := p.runPrefill(w, r, req, chat, path, id, requestID, dec)
	if !ok {
		return
	}
	p.log.Debug("prefilled", "transfer", id, "prefill", pre, "decode", dec.name, "params", len(kv) > 0)
	p.runDecode(w, r, req, path, requestID, kv, pre, dec)
}

// runPrefill picks the prefill instance and runs the prefill stage. It
// returns the params the instance answered and its name, or writes the
// error and reports false.
func (p *proxy) runPrefill(w http.ResponseWriter, r *http.Request, req *completionRequest, chat bool,
	path, id, requestID string, dec *upstream) (json.RawMessage, string, bool) {
	sreq, scorable := req.scoreRequest(chat)
	pre, scored := p.prefill.pickPrefill(r.Context(), p.score, sreq, scorable)
	defer pre.inflight.Add(-1)
	p.log.Debug("prefill chosen", "instance", pre.name, "by_score", scored)
	body, err := req.prefillBody(id, dec.pushTo)
	if err != nil { // unreachable: the fields were decoded from JSON
		proxyError(w, http.StatusInternalServerError, "internal_error", err.Error(), nil)
		return nil, "", false
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.prefillTimeout)
	defer cancel()
	resp, err := p.send(ctx, http.MethodPost, pre.base+path, body, r.Header, requestID)
	if err != nil {
		p.stageFailed(w, r, ctx, "prefill", pre, p.prefillTimeout, err)
		return nil, "", false
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		p.upstreamStatus(w, "prefill", pre, resp)
		return nil, "", false
	}
	answer, err := io.ReadAll(io.LimitReader(resp.Body, prefillMaxAnswer+1))
	if err != nil {
		p.stageFailed(w, r, ctx, "prefill", pre, p.prefillTimeout, err)
		return nil, "", false
	}
	var got producerAnswer
	if len(answer) > prefillMaxAnswer {
		err = fmt.Errorf("answer over %d bytes", prefillMaxAnswer)
	} else {
		err = json.Unmarshal(answer, &got)
	}
	if err != nil {
		proxyError(w, http.StatusBadGateway, "upstream_error",
			fmt.Sprintf("prefill instance %s (%s) answered %d with a body that is not a completion: %v",
				pre.name, pre.base, resp.StatusCode, err), nil)
		return nil, "", false
	}
	if len(got.KVTransferParams) == 0 || isNull(got.KVTransferParams) {
		// The engine kept no KV for another instance (no KV connector, a
		// prompt shorter than a block): the decode side computes it.
		p.noParams.Log("prefill", pre.name, "transfer", id)
	}
	return got.KVTransferParams, pre.name, true
}

// runDecode sends the decode stage and relays its answer.
func (p *proxy) runDecode(w http.ResponseWriter, r *http.Request, req *completionRequest,
	path, requestID string, kv json.RawMessage, pre string, dec *upstream) {
	body, err := req.decodeBody(kv)
	if err != nil { // unreachable: kv was decoded from JSON
		proxyError(w, http.StatusInternalServerError, "internal_error", err.Error(), nil)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.decodeTimeout)
	defer cancel()
	resp, err := p.send(ctx, http.MethodPost, dec.base+path, body, r.Header, requestID)
	if err != nil {
		p.stageFailed(w, r, ctx, "decode", dec, p.decodeTimeout, err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		p.upstreamStatus(w, "decode", dec, resp)
		return
	}
	w.Header().Set("X-Kvtier-Prefill", pre)
	w.Header().Set("X-Kvtier-Decode", dec.name)
	p.relay(w, r, ctx, "decode", dec, p.decodeTimeout, resp, req.stream)
}

// send makes one upstream request, passing on the client's credentials
// and the request id both stages share (vLLM's connectors match the two
// by it).
func (p *proxy) send(ctx context.Context, method, url string, body []byte, from http.Header, requestID string) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if auth := from.Get("Authorization"); auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if requestID != "" {
		req.Header.Set("X-Request-Id", requestID)
	}
	return p.hc.Do(req)
}

// relay copies an upstream answer to the client as it arrives, flushing
// after every read when it is a stream, so that each server-sent event
// reaches the client when the engine sends it. A failure half-way cannot
// change the status any more: a stream gets an error event, any other
// answer is cut off so that the client sees it incomplete.
func (p *proxy) relay(w http.ResponseWriter, r *http.Request, ctx context.Context, stage string, u *upstream,
	limit time.Duration, resp *http.Response, stream bool) {
	for _, h := range []string{"Content-Type", "Cache-Control"} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	stream = stream || strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	if !stream && resp.ContentLength >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	bp := p.bufs.Get().(*[]byte)
	defer p.bufs.Put(bp)
	buf := *bp
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return // the client is gone; ctx ends the upstream request
			}
			if stream {
				rc.Flush()
			}
		}
		if err == io.EOF {
			return
		}
		if err != nil {
			p.relayFailed(w, r, ctx, stage, u, limit, err, stream)
			return
		}
	}
}

// relayFailed ends an answer whose upstream failed after the status was
// sent.
func (p *proxy) relayFailed(w http.ResponseWriter, r *http.Request, ctx context.Context, stage string, u *upstream,
	limit time.Duration, err error, stream bool) {
	if r.Context().Err() != nil {
		return // the client left first
	}
	msg := fmt.Sprintf("%s instance %s (%s) failed mid-answer: %v", stage, u.name, u.base, err)
	if ctx.Err() == context.DeadlineExceeded {
		msg = fmt.Sprintf("%s instance %s (%s) timed out after %v mid-answer", stage, u.name, u.base, limit)
	}
	p.relayErrs.Log("stage", stage, "instance", u.name, "err", err)
	if !stream {
		panic(http.ErrAbortHandler) // drop the connection: the body is incomplete
	}
	ev, _ := json.Marshal(errorBody{Error: errorDetail{Message: msg, Type: "upstream_error", Code: http.StatusBadGateway,
		Stage: stage, Instance: u.name}})
	fmt.Fprintf(w, "data: %s\n\n", ev)
	http.NewResponseController(w).Flush()
}

// stageFailed reports a stage that got no answer: the client gone (no
// answer can reach it), the stage's timeout, or the instance unreachable.
func (p *proxy) stageFailed(w http.ResponseWriter, r *http.Request, ctx context.Context, stage string, u *upstream,
	limit time.Duration, err error) {
	if r.Context().Err() != nil {
		p.log.Debug("client left", "stage", stage, "instance", u.name)
		return
	}
	if ctx.Err() == context.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded) {
		proxyError(w, http.StatusGatewayTimeout, "timeout",
			fmt.Sprintf("%s instance %s (%s) did not answer within %v", stage, u.name, u.base, limit), &errorDetail{Stage: stage, Instance: u.name})
		return
	}
	proxyError(w, http.StatusBadGateway, "upstream_error",
		fmt.Sprintf("%s instance %s (%s) unreachable: %v", stage, u.name, u.base, err), &errorDetail{Stage: stage, Instance: u.name})
}

// upstreamStatus passes an instance's error answer on: its status, and its
// body under "upstream" (as JSON when it is, else as text), with a message
// naming the stage and the instance.
func (p *proxy) upstreamStatus(w http.ResponseWriter, stage string, u *upstream, resp *http.Response) {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, upstreamErrorMax))
	d := &errorDetail{Stage: stage, Instance: u.name}
	if json.Valid(body) {
		d.Upstream = json.RawMessage(body)
	} else if len(body) > 0 {
		d.Upstream, _ = json.Marshal(string(body))
	}
	msg := fmt.Sprintf("%s instance %s (%s) answered %s", stage, u.name, u.base, resp.Status)
	if m := upstreamMessage(body); m != "" {
		msg += ": " + m
	}
	p.logs.Log(p.log, slog.LevelInfo, "upstream error", "stage", stage, "instance", u.name, "status", resp.StatusCode)
	proxyError(w, resp.StatusCode, "upstream_error", msg, d)
}

// upstreamMessage finds the message of a vLLM error body: {"error":
// {"message"}} (OpenAI's shape) or {"message"} (vLLM's older one).
func upstreamMessage(body []byte) string {
	var e struct {
		Message string `json:"message"`
		Error   struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return ""
	}
	m := e.Error.Message
	if m == "" {
		m = e.Message
	}
	if len(m) > 1000 {
		m = m[:1000] + "…"
	}
	return m
}

// errorBody is the proxy's error answer, in OpenAI's shape plus the stage
// and instance that failed and the instance's own answer.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message  string          `json:"message"`
	Type     string          `json:"type"`
	Code     int             `json:"code"`
	Stage    string          `json:"stage,omitempty"`
	Instance string          `json:"instance,omitempty"`
	Upstream json.RawMessage `json:"upstream,omitempty"`
}

func proxyError(w http.ResponseWriter, status int, typ, msg string, d *errorDetail) {
	var e errorDetail
	if d != nil {
		e = *d
	}
	e.Message, e.Type, e.Code = msg, typ, status
	writeJSON(w, status, errorBody{Error: e})
}

// newTransferID returns a fresh transfer id, 128 random bits in hex.
func newTransferID() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}
