package controller

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// fakeEngine stands in for a vLLM OpenAI server running a KV connector:
// vLLM cannot run here (no GPU, no wheel), so the proxy's tests talk to
// this in-process HTTP server instead. It checks each request the way the
// real instance depends on it:
//
//   - prefill role: the request must carry kv_transfer_params with
//     do_remote_decode true, a kvtier_transfer_id and a kvtier_push_to,
//     max_tokens 1, stream false, and no min_tokens; it answers a one-token
//     completion whose kv_transfer_params name the transfer, as a
//     producer's connector returns them from request_finished.
//   - decode role: the request must carry the producer's params
//     (do_remote_prefill true and the transfer id); it answers the whole
//     completion, as server-sent events when stream is true.
//
// A request breaking these rules gets 400, so a test that expects 200
// fails when the proxy builds a stage's request wrongly.
type fakeEngine struct {
	name string
	role string // "prefill" or "decode"
	srv  *httptest.Server

	mu   sync.Mutex
	reqs []fakeSeen

	// Behaviours a test may set before sending requests.
	status   int           // answer this status with an error body (0: normal)
	noParams bool          // prefill: answer without kv_transfer_params
	lenient  bool          // decode: accept a request without params
	events   int           // decode: SSE chunks in a stream (default 3)
	hold     chan struct{} // block before answering until closed or the request ends
	midway   chan struct{} // decode stream: block after the first event until closed or the request ends
	gone     chan struct{} // closed when a held request's context ends
	arrived  chan string   // receives each request's path, when set
	onEvent  func(i int)   // decode stream: called after event i is flushed
	goneOnce sync.Once
}

// fakeSeen is one request as the fake received it.
type fakeSeen struct {
	Path      string
	Body      map[string]any
	RequestID string
	Auth      string
}

func newFakeEngine(t testing.TB, name, role string) *fakeEngine {
	f := &fakeEngine{name: name, role: role, events: 3, gone: make(chan struct{})}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeEngine) seen() []fakeSeen {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeSeen(nil), f.reqs...)
}

func (f *fakeEngine) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/models" {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":"m","object":"model","owned_by":%q}]}`, f.name)
		return
	}
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		f.fail(w, 400, "bad json: "+err.Error())
		return
	}
	s := fakeSeen{Path: r.URL.Path, Body: body, RequestID: r.Header.Get("X-Request-Id"), Auth: r.Header.Get("Authorization")}
	f.mu.Lock()
	f.reqs = append(f.reqs, s)
	f.mu.Unlock()
	if f.arrived != nil {
		f.arrived <- r.URL.Path
	}
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-r.Context().Done():
			f.goneOnce.Do(func() { close(f.gone) })
			return
		}
	}
	if f.status != 0 {
		f.fail(w, f.status, "engine says no")
		return
	}
	if msg := f.checkRole(s); msg != "" {
		f.fail(w, 400, msg)
		return
	}
	if f.role == "prefill" {
		f.answerPrefill(w, s)
		return
	}
	f.answerDecode(w, r, s)
}

// fail answers an error in vLLM's shape.
func (f *fakeEngine) fail(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"message":%q,"type":"BadRequestError","param":null,"code":%d}}`, f.name+": "+msg, status)
}

func (f *fakeEngine) checkRole(s fakeSeen) string {
	kv, _ := s.Body["kv_transfer_params"].(map[string]any)
	if f.role == "prefill" {
		switch {
		case kv == nil || kv["do_remote_decode"] != true:
			return "prefill without do_remote_decode"
		case kv["kvtier_transfer_id"] == nil || kv["kvtier_transfer_id"] == "":
			return "prefill without kvtier_transfer_id"
		case kv["kvtier_push_to"] == nil || kv["kvtier_push_to"] == "":
			return "prefill without kvtier_push_to"
		case s.Body["max_tokens"] != 1.0:
			return fmt.Sprintf("prefill max_tokens %v", s.Body["max_tokens"])
		case s.Body["stream"] != false:
			return "prefill streamed"
		case s.Body["min_tokens"] != nil || s.Body["stream_options"] != nil:
			return "prefill with min_tokens or stream_options"
		}
		if _, ok := s.Body["max_completion_tokens"]; ok && s.Body["max_completion_tokens"] != 1.0 {
			return "prefill max_completion_tokens not 1"
		}
		return ""
	}
	if kv == nil {
		if f.lenient {
			return ""
		}
		return "decode without kv_transfer_params"
	}
	if kv["do_remote_prefill"] != true || kv["kvtier_transfer_id"] == nil || kv["do_remote_decode"] == true {
		return fmt.Sprintf("decode with producer params %v", kv)
	}
	return ""
}

// answerPrefill answers one token and the params a producer returns.
func (f *fakeEngine) answerPrefill(w http.ResponseWriter, s fakeSeen) {
	kv := s.Body["kv_transfer_params"].(map[string]any)
	out := map[string]any{
		"id": "cmpl-" + s.RequestID, "object": "text_completion", "model": s.Body["model"],
		"choices": []any{map[string]any{"index": 0, "text": "x", "finish_reason": "length"}},
	}
	if !f.noParams {
		out["kv_transfer_params"] = map[string]any{
			"do_remote_prefill": true, "do_remote_decode": false,
			"kvtier_transfer_id": kv["kvtier_transfer_id"], "kvtier_push_to": kv["kvtier_push_to"],
			"remote_engine_id": f.name, "remote_block_ids": []int{4, 5, 6}, "remote_host": "127.0.0.1", "remote_port": 5600,
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

// answerDecode answers the completion: "<decode name>:<transfer id>:<i>"
// pieces, streamed as SSE chunks or whole.
func (f *fakeEngine) answerDecode(w http.ResponseWriter, r *http.Request, s fakeSeen) {
	id := "none"
	if kv, ok := s.Body["kv_transfer_params"].(map[string]any); ok {
		id, _ = kv["kvtier_transfer_id"].(string)
	}
	piece := func(i int) string { return fmt.Sprintf("%s:%s:%d;", f.name, id, i) }
	if s.Body["stream"] != true {
		var text strings.Builder
		for i := range f.events {
			text.WriteString(piece(i))
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"id": "cmpl-" + s.RequestID, "object": "text_completion",
			"choices": []any{map[string]any{"index": 0, "text": text.String(), "finish_reason": "stop"}}})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	for i := range f.events {
		ev, _ := json.Marshal(map[string]any{"object": "text_completion.chunk",
			"choices": []any{map[string]any{"index": 0, "text": piece(i)}}})
		fmt.Fprintf(w, "data: %s\n\n", ev)
		w.(http.Flusher).Flush()
		if f.onEvent != nil {
			f.onEvent(i)
		}
		if i == 0 && f.midway != nil {
			select {
			case <-f.midway:
			case <-r.Context().Done():
				f.goneOnce.Do(func() { close(f.gone) })
				return
			}
		}
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// spec is the fake's instance spec for the proxy's configuration.
func (f *fakeEngine) spec() string {
	if f.role == "decode" {
		return f.name + "=" + f.srv.URL + "=127.0.0.1:" + daemonPort(f.name)
	}
	return f.name + "=" + f.srv.URL
}

// daemonPort is a made-up daemon port per decode instance, so that tests
// can tell which one a prefill request was told to push to.
func daemonPort(name string) string {
	return fmt.Sprint(7000 + int(name[len(name)-1]))
}
