package controller

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/router/api"
	"kvtier/router/index"
	"kvtier/router/tokenize"
)

// pdRig is a proxy in front of fake prefill and decode engines
// (fakeEngine: vLLM cannot run here).
type pdRig struct {
	p        *proxy
	srv      *httptest.Server
	pre, dec []*fakeEngine
}

func newRig(t testing.TB, nPre, nDec int, set func(*proxyConfig)) *pdRig {
	t.Helper()
	rig := &pdRig{}
	cfg := proxyConfig{PrefillTimeout: hang, DecodeTimeout: hang}
	for i := range nPre {
		f := newFakeEngine(t, fmt.Sprintf("p%d", i+1), "prefill")
		rig.pre = append(rig.pre, f)
		cfg.Prefill = append(cfg.Prefill, f.spec())
	}
	for i := range nDec {
		f := newFakeEngine(t, fmt.Sprintf("d%d", i+1), "decode")
		rig.dec = append(rig.dec, f)
		cfg.Decode = append(cfg.Decode, f.spec())
	}
	if set != nil {
		set(&cfg)
	}
	p, err := newProxy(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rig.p = p
	rig.srv = httptest.NewServer(p)
	t.Cleanup(rig.srv.Close)
	return rig
}

// send posts body to the proxy and returns the answer, its body unread.
func (rig *pdRig) send(t *testing.T, ctx context.Context, path, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rig.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer sk-test")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// post posts body and reads the whole answer.
func (rig *pdRig) post(t *testing.T, path, body string) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	resp := rig.send(t, ctx, path, body)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, out
}

var transferID = regexp.MustCompile(`^[0-9a-f]{32}$`)

func TestProxyCompletions(t *testing.T) {
	for _, tc := range []struct {
		path   string
		stream bool
	}{
		{"/v1/completions", false},
		{"/v1/completions", true},
		{"/v1/chat/completions", false},
		{"/v1/chat/completions", true},
	} {
		t.Run(fmt.Sprintf("%s stream=%v", tc.path, tc.stream), func(t *testing.T) {
			rig := newRig(t, 1, 1, nil)
			body := fmt.Sprintf(`{"model":"m","prompt":"hello there","max_tokens":50,"min_tokens":3,"temperature":0.5,"stream":%v,"stream_options":{"include_usage":true}}`, tc.stream)
			if strings.Contains(tc.path, "chat") {
				body = fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":50,"max_tokens":40,"min_completion_tokens":2,"stream":%v}`, tc.stream)
			}
			resp, out := rig.post(t, tc.path, body)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, out)
			}
			if resp.Header.Get("X-Kvtier-Prefill") != "p1" || resp.Header.Get("X-Kvtier-Decode") != "d1" {
				t.Errorf("instances %q %q", resp.Header.Get("X-Kvtier-Prefill"), resp.Header.Get("X-Kvtier-Decode"))
			}
			pre, dec := rig.pre[0].seen(), rig.dec[0].seen()
			if len(pre) != 1 || len(dec) != 1 {
				t.Fatalf("prefill saw %d requests, decode %d; want 1 each", len(pre), len(dec))
			}
			checkStages(t, tc.path, body, pre[0], dec[0])
			id := dec[0].Body["kv_transfer_params"].(map[string]any)["kvtier_transfer_id"].(string)
			want := fmt.Sprintf("d1:%s:0;d1:%s:1;d1:%s:2;", id, id, id)
			if got := answerText(t, out, tc.stream); got != want {
				t.Errorf("answer text %q, want %q\n%s", got, want, out)
			}
		})
	}
}

// checkStages checks the two stages' requests against the client's body.
func checkStages(t *testing.T, path, body string, pre, dec fakeSeen) {
	t.Helper()
	var client map[string]any
	json.Unmarshal([]byte(body), &client)
	if pre.Path != path || dec.Path != path {
		t.Errorf("paths %s %s, want %s", pre.Path, dec.Path, path)
	}
	kv := pre.Body["kv_transfer_params"].(map[string]any)
	id, _ := kv["kvtier_transfer_id"].(string)
	if !transferID.MatchString(id) || kv["kvtier_push_to"] != "127.0.0.1:"+daemonPort("d1") || len(kv) != 3 {
		t.Errorf("prefill kv_transfer_params %v", kv)
	}
	// The prefill stage is the client's request for one token, unstreamed.
	wantPre := map[string]any{}
	for k, v := range client {
		wantPre[k] = v
	}
	for _, k := range []string{"min_tokens", "min_completion_tokens", "stream_options"} {
		delete(wantPre, k)
	}
	wantPre["max_tokens"], wantPre["stream"], wantPre["kv_transfer_params"] = 1.0, false, kv
	if _, ok := client["max_completion_tokens"]; ok {
		wantPre["max_completion_tokens"] = 1.0
	}
	if !reflect.DeepEqual(pre.Body, wantPre) {
		t.Errorf("prefill body\n%v, want\n%v", pre.Body, wantPre)
	}
	// The decode stage is the client's request with the producer's params
	// exactly as the prefill instance answered them.
	wantDec := map[string]any{}
	for k, v := range client {
		wantDec[k] = v
	}
	wantDec["kv_transfer_params"] = map[string]any{
		"do_remote_prefill": true, "do_remote_decode": false, "kvtier_transfer_id": id,
		"kvtier_push_to": kv["kvtier_push_to"], "remote_engine_id": "p1",
		"remote_block_ids": []any{4.0, 5.0, 6.0}, "remote_host": "127.0.0.1", "remote_port": 5600.0,
	}
	if !reflect.DeepEqual(dec.Body, wantDec) {
		t.Errorf("decode body\n%v, want\n%v", dec.Body, wantDec)
	}
	if pre.RequestID == "" || pre.RequestID != dec.RequestID {
		t.Errorf("request ids %q and %q, want one shared id", pre.RequestID, dec.RequestID)
	}
	if pre.Auth != "Bearer sk-test" || dec.Auth != "Bearer sk-test" {
		t.Errorf("credentials not passed on: %q %q", pre.Auth, dec.Auth)
	}
}

// answerText joins the text of a completion answer, whole or streamed.
func answerText(t *testing.T, out []byte, stream bool) string {
	t.Helper()
	if !stream {
		var c struct {
			Choices []struct{ Text string } `json:"choices"`
		}
		if err := json.Unmarshal(out, &c); err != nil || len(c.Choices) != 1 {
			t.Fatalf("answer %s: %v", out, err)
		}
		return c.Choices[0].Text
	}
	events := strings.Split(strings.TrimSuffix(string(out), "\n\n"), "\n\n")
	if len(events) == 0 || events[len(events)-1] != "data: [DONE]" {
		t.Fatalf("stream does not end with [DONE]: %q", out)
	}
	var text strings.Builder
	for _, ev := range events[:len(events)-1] {
		var c struct {
			Choices []struct{ Text string } `json:"choices"`
		}
		if err := json.Unmarshal([]byte(strings.TrimPrefix(ev, "data: ")), &c); err != nil || len(c.Choices) != 1 {
			t.Fatalf("event %q: %v", ev, err)
		}
		text.WriteString(c.Choices[0].Text)
	}
	return text.String()
}

// readEvent reads one server-sent event, failing the test if none comes
// within hang (a proxy that buffers the stream never delivers it).
func readEvent(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		var ev strings.Builder
		for {
			line, err := br.ReadString('\n')
			ev.WriteString(line)
			if err != nil || line == "\n" {
				got <- ev.String()
				return
			}
		}
	}()
	select {
	case ev := <-got:
		return ev
	case <-time.After(hang):
		t.Fatalf("no event within %v", hang)
		return ""
	}
}

// TestProxyStreamsEachEvent checks that an event reaches the client while
// the engine is still generating: the fake sends its first event and then
// waits for the test, which must have read that event to let it go on.
func TestProxyStreamsEachEvent(t *testing.T) {
	rig := newRig(t, 1, 1, nil)
	rig.dec[0].midway = make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	resp := rig.send(t, ctx, "/v1/completions", `{"model":"m","prompt":"p","stream":true}`)
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	br := bufio.NewReader(resp.Body)
	if ev := readEvent(t, br); !strings.Contains(ev, ":0;") {
		t.Fatalf("first event %q", ev)
	}
	close(rig.dec[0].midway)
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), ":2;") || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Errorf("rest of the stream %q", rest)
	}
}

// scoredRig is a rig whose prefill instances p1..p3 are scored by a real
// score API over an in-memory index, fed as router/ingest feeds it.
func scoredRig(t *testing.T) (*pdRig, func(pod string, tokens []uint32)) {
	t.Helper()
	const blockSize = 16
	ix, err := index.New(index.Config{MaxBlocks: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	pods := index.NewPods()
	hasher, err := chunk.NewVLLMHasher("0", blockSize)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenize.Open("tiktoken:cl100k_base")
	if err != nil {
		t.Fatal(err)
	}
	pool := tokenize.NewPool(tok, tokenize.PoolOptions{})
	h, err := api.New(api.Config{Index: ix, Pods: pods, Hasher: hasher,
		Tokenizers: func(model string) *tokenize.Pool {
			if model == "m" {
				return pool
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	hold := func(pod string, tokens []uint32) {
		id, err := pods.Intern(pod)
		if err != nil {
			t.Fatal(err)
		}
		var hashes []uint64
		for _, b := range hasher.BlockHashes(nil, tokens, chunk.VLLMRequest{}) {
			hashes = append(hashes, chunk.EventHash(b))
		}
		if err := ix.Add(id, index.GPU, hashes); err != nil {
			t.Fatal(err)
		}
	}
	return newRig(t, 3, 1, func(c *proxyConfig) { c.Score = h.Score }), hold
}

func TestProxyPrefillByScore(t *testing.T) {
	rig, hold := scoredRig(t)
	ids := make([]uint32, 64)
	for i := range ids {
		ids[i] = uint32(1000 + 7*i)
	}
	hold("p2", ids)
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 20)
	toks, err := tokenize.NewPool(mustTiktoken(t), tokenize.PoolOptions{}).EncodeSpecial(context.Background(), text, nil)
	if err != nil {
		t.Fatal(err)
	}
	hold("p3", toks)
	idsJSON, _ := json.Marshal(ids)
	textJSON, _ := json.Marshal(text)
	for _, tc := range []struct{ body, want string }{
		{`{"model":"m","prompt":` + string(idsJSON) + `}`, "p2"},
		{`{"model":"m","prompt":[` + string(idsJSON) + `]}`, "p2"},
		{`{"model":"m","prompt":` + string(textJSON) + `}`, "p3"},
		{`{"model":"m","prompt":[` + string(textJSON) + `],"add_special_tokens":true}`, "p3"},
	} {
		for range 3 { // the holder wins every time, not in turn
			resp, out := rig.post(t, "/v1/completions", tc.body)
			if resp.StatusCode != 200 || resp.Header.Get("X-Kvtier-Prefill") != tc.want {
				t.Fatalf("%.60s: status %d prefill %q, want %s: %s", tc.body, resp.StatusCode,
					resp.Header.Get("X-Kvtier-Prefill"), tc.want, out)
			}
		}
	}
	// A prompt nobody holds, a model without a tokenizer, a chat: each
	// goes round the instances in turn.
	for _, body := range []string{
		`{"model":"m","prompt":"something else entirely"}`,
		`{"model":"other","prompt":` + string(textJSON) + `}`,
		`{"model":"m","messages":[{"role":"user","content":` + string(textJSON) + `}]}`,
	} {
		path := "/v1/completions"
		if strings.Contains(body, "messages") {
			path = "/v1/chat/completions"
		}
		seen := map[string]bool{}
		for range 3 {
			resp, out := rig.post(t, path, body)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, out)
			}
			seen[resp.Header.Get("X-Kvtier-Prefill")] = true
		}
		if len(seen) != 3 {
			t.Errorf("%.50s: prefill instances %v over three requests, want all three", body, seen)
		}
	}
}

func mustTiktoken(t *testing.T) tokenize.Tokenizer {
	tok, err := tokenize.Open("tiktoken:cl100k_base")
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestProxyDecodeByLoad holds a stream open on one decode instance and
// checks that every request meanwhile goes to the other (turns alone
// would alternate), that a second open stream goes there too, and that
// the first instance is preferred again once its stream is over.
func TestProxyDecodeByLoad(t *testing.T) {
	rig := newRig(t, 1, 2, nil)
	for _, d := range rig.dec {
		d.midway = make(chan struct{})
	}
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	open := func() (*http.Response, *bufio.Reader, string) {
		resp := rig.send(t, ctx, "/v1/completions", `{"model":"m","prompt":"p","stream":true}`)
		br := bufio.NewReader(resp.Body)
		readEvent(t, br) // the stream is open on its decode instance
		return resp, br, resp.Header.Get("X-Kvtier-Decode")
	}
	a, abr, busy := open()
	for i := range 4 {
		resp, out := rig.post(t, "/v1/completions", `{"model":"m","prompt":"p"}`)
		if got := resp.Header.Get("X-Kvtier-Decode"); resp.StatusCode != 200 || got == busy {
			t.Fatalf("request %d: status %d on %q while %s streams: %s", i, resp.StatusCode, got, busy, out)
		}
	}
	b, _, second := open()
	defer b.Body.Close()
	if second == busy || second == "" {
		t.Fatalf("two open streams on %q and %q, want one on each decode instance", busy, second)
	}
	byName := map[string]*fakeEngine{"d1": rig.dec[0], "d2": rig.dec[1]}
	close(byName[busy].midway)
	io.ReadAll(abr)
	a.Body.Close()
	for range 3 {
		resp, _ := rig.post(t, "/v1/completions", `{"model":"m","prompt":"p"}`)
		if got := resp.Header.Get("X-Kvtier-Decode"); got != busy {
			t.Errorf("request on %s, want %s (idle now) rather than %s (streaming)", got, busy, second)
		}
	}
	close(byName[second].midway)
}

// errorAnswer decodes the proxy's error body.
func errorAnswer(t *testing.T, out []byte) errorDetail {
	t.Helper()
	var e errorBody
	if err := json.Unmarshal(out, &e); err != nil || e.Error.Message == "" {
		t.Fatalf("error answer %s: %v", out, err)
	}
	return e.Error
}

func TestProxyPassesErrorsThrough(t *testing.T) {
	t.Run("prefill", func(t *testing.T) {
		rig := newRig(t, 1, 1, nil)
		rig.pre[0].status = 503
		resp, out := rig.post(t, "/v1/completions", `{"model":"m","prompt":"p"}`)
		e := errorAnswer(t, out)
		if resp.StatusCode != 503 || e.Stage != "prefill" || e.Instance != "p1" ||
			!strings.Contains(e.Message, "prefill instance p1") || !strings.Contains(e.Message, "p1: engine says no") ||
			!strings.Contains(string(e.Upstream), `"code":503`) {
			t.Errorf("status %d, error %+v", resp.StatusCode, e)
		}
		if n := len(rig.dec[0].seen()); n != 0 {
			t.Errorf("decode called %d times after a failed prefill", n)
		}
	})
	t.Run("decode", func(t *testing.T) {
		rig := newRig(t, 1, 1, nil)
		rig.dec[0].status = 400
		resp, out := rig.post(t, "/v1/chat/completions", `{"model":"m","messages":[],"stream":true}`)
		e := errorAnswer(t, out)
		if resp.StatusCode != 400 || e.Stage != "decode" || e.Instance != "d1" || !strings.Contains(e.Message, "d1: engine says no") {
			t.Errorf("status %d, error %+v", resp.StatusCode, e)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		gone := httptest.NewServer(http.NotFoundHandler())
		gone.Close()
		rig := newRig(t, 0, 1, func(c *proxyConfig) { c.Prefill = []string{"p9=" + gone.URL} })
		resp, out := rig.post(t, "/v1/completions", `{"model":"m","prompt":"p"}`)
		if e := errorAnswer(t, out); resp.StatusCode != 502 || e.Stage != "prefill" || !strings.Contains(e.Message, "unreachable") {
			t.Errorf("status %d, error %+v", resp.StatusCode, e)
		}
	})
	t.Run("prefill not a completion", func(t *testing.T) {
		html := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "<html>") }))
		defer html.Close()
		rig := newRig(t, 0, 1, func(c *proxyConfig) { c.Prefill = []string{"p1=" + html.URL} })
		resp, out := rig.post(t, "/v1/completions", `{"model":"m","prompt":"p"}`)
		if e := errorAnswer(t, out); resp.StatusCode != 502 || !strings.Contains(e.Message, "not a completion") {
			t.Errorf("status %d, error %+v", resp.StatusCode, e)
		}
	})
}

// TestProxyNoParams: a prefill instance that answers no params (no KV
// connector, a prompt under a block) leaves the decode instance to compute
// the prompt; a client's own kv_transfer_params never reach it.
func TestProxyNoParams(t *testing.T) {
	rig := newRig(t, 1, 1, nil)
	rig.pre[0].noParams = true
	rig.dec[0].lenient = true
	resp, out := rig.post(t, "/v1/completions", `{"model":"m","prompt":"p","kv_transfer_params":{"do_remote_prefill":true}}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	if kv, ok := rig.dec[0].seen()[0].Body["kv_transfer_params"]; ok {
		t.Errorf("decode got kv_transfer_params %v", kv)
	}
}

func TestProxyStageTimeouts(t *testing.T) {
	for _, stage := range []string{"prefill", "decode"} {
		t.Run(stage, func(t *testing.T) {
			rig := newRig(t, 1, 1, func(c *proxyConfig) {
				c.PrefillTimeout, c.DecodeTimeout = hang, hang
				if stage == "prefill" {
					c.PrefillTimeout = 50 * time.Millisecond
				} else {
					c.DecodeTimeout = 50 * time.Millisecond
				}
			})
			f := rig.pre[0]
			if stage == "decode" {
				f = rig.dec[0]
			}
			f.hold = make(chan struct{}) // never answers
			resp, out := rig.post(t, "/v1/completions", `{"model":"m","prompt":"p"}`)
			e := errorAnswer(t, out)
			if resp.StatusCode != 504 || e.Stage != stage || !strings.Contains(e.Message, "did not answer within 50ms") {
				t.Errorf("status %d, error %+v", resp.StatusCode, e)
			}
			waitClosed(t, f.gone, "the timed-out upstream request was not cancelled")
		})
	}
	t.Run("mid-stream", func(t *testing.T) {
		rig := newRig(t, 1, 1, func(c *proxyConfig) { c.DecodeTimeout = 2 * time.Second })
		rig.dec[0].midway = make(chan struct{}) // one event, then silence
		resp, out := rig.post(t, "/v1/completions", `{"model":"m","prompt":"p","stream":true}`)
		if resp.StatusCode != 200 || !strings.Contains(string(out), ":0;") ||
			!strings.Contains(string(out), `"stage":"decode"`) || !strings.Contains(string(out), "timed out after 2s mid-answer") {
			t.Errorf("status %d, stream %q", resp.StatusCode, out)
		}
	})
}

func waitClosed(t *testing.T, ch <-chan struct{}, msg string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(hang):
		t.Fatal(msg)
	}
}

// TestProxyClientGone checks that a client hanging up cancels the stage
// in progress on the engine.
func TestProxyClientGone(t *testing.T) {
	t.Run("during prefill", func(t *testing.T) {
		rig := newRig(t, 1, 1, nil)
		rig.pre[0].hold = make(chan struct{})
		rig.pre[0].arrived = make(chan string, 1)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rig.srv.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"p"}`))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		select {
		case <-rig.pre[0].arrived:
		case <-time.After(hang):
			t.Fatal("prefill never reached")
		}
		cancel()
		waitClosed(t, rig.pre[0].gone, "the prefill request was not cancelled with the client's")
		<-done
		if n := len(rig.dec[0].seen()); n != 0 {
			t.Errorf("decode called %d times for a client that left", n)
		}
	})
	t.Run("during the stream", func(t *testing.T) {
		rig := newRig(t, 1, 1, nil)
		rig.dec[0].midway = make(chan struct{})
		ctx, cancel := context.WithCancel(context.Background())
		resp := rig.send(t, ctx, "/v1/completions", `{"model":"m","prompt":"p","stream":true}`)
		readEvent(t, bufio.NewReader(resp.Body))
		cancel()
		resp.Body.Close()
		waitClosed(t, rig.dec[0].gone, "the decode stream was not cancelled with the client's")
	})
}

func TestProxyRefusesBadRequests(t *testing.T) {
	rig := newRig(t, 1, 1, nil)
	for _, tc := range []struct {
		body   string
		status int
		msg    string
	}{
		{"", 400, "not a JSON object"},
		{"{", 400, "not a JSON object"},
		{"[]", 400, "not a JSON object"},
		{"null", 400, "not a JSON object"},
		{`{"model":"m"} {}`, 400, "not a JSON object"},
		{`{"model":5}`, 400, "model: want a string"},
		{`{"model":"m","stream":"yes"}`, 400, "stream: want true or false"},
		{`{"model":"m","prompt":"` + strings.Repeat("x", proxyMaxBody) + `"}`, 413, "request body over"},
	} {
		resp, out := rig.post(t, "/v1/completions", tc.body)
		if e := errorAnswer(t, out); resp.StatusCode != tc.status || !strings.Contains(e.Message, tc.msg) || e.Type != "invalid_request_error" {
			t.Errorf("%.40q: status %d, error %+v; want %d %q", tc.body, resp.StatusCode, e, tc.status, tc.msg)
		}
	}
	resp, err := http.Get(rig.srv.URL + "/v1/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET: %d", resp.StatusCode)
	}
	if n := len(rig.pre[0].seen()) + len(rig.dec[0].seen()); n != 0 {
		t.Errorf("%d bad requests reached the engines", n)
	}
}

func TestProxyModelsAndHealth(t *testing.T) {
	rig := newRig(t, 2, 1, nil)
	for path, want := range map[string]string{
		"/v1/models": `"owned_by":"d1"`,
		"/healthz":   `{"decode":1,"prefill":2,"status":"ok"}`,
	} {
		resp, err := http.Get(rig.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(out), want) {
			t.Errorf("%s: %d %s, want %s", path, resp.StatusCode, out, want)
		}
	}
}

func TestParseUpstreams(t *testing.T) {
	p, err := parseUpstreams("decode", []string{"d1=http://10.0.0.7:8000/=10.0.0.7:7470", "d2=https://h=h:1"}, true)
	if err != nil {
		t.Fatal(err)
	}
	if u := p.list[0]; u.name != "d1" || u.base != "http://10.0.0.7:8000" || u.pushTo != "10.0.0.7:7470" {
		t.Errorf("parsed %+v", u)
	}
	for _, bad := range [][]string{
		{"d1=http://h:1"},        // no daemon address
		{"d1=http://h:1=nohost"}, // not HOST:PORT
		{"=http://h:1=h:2"},
		{"d1=ftp://h:1=h:2"},
		{"d1=http://h:1?x=1=h:2"},
		{"d1=http://h:1=h:2", "d1=http://h:3=h:4"},
	} {
		if _, err := parseUpstreams("decode", bad, true); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := parseUpstreams("prefill", []string{"p1=http://h:1=h:2"}, false); err == nil {
		t.Error("a prefill spec with a daemon address accepted")
	}
}

// FuzzProxyRequest: no body makes the request handling panic, and every
// body the proxy accepts becomes valid stage requests.
func FuzzProxyRequest(f *testing.F) {
	for _, s := range []string{`{"model":"m","prompt":"p"}`, `{"model":"m","prompt":[1,2,3],"stream":true}`,
		`{"prompt":[[1,2]],"cache_salt":"s","add_special_tokens":false}`, `{"prompt":["a","b"]}`, `{"prompt":[-1]}`,
		`{"messages":[],"max_completion_tokens":9}`, `{"kv_transfer_params":null}`, `[]`, `{"model":null}`,
		`{"a\"b\\c\u0001\u00e9\ud83d\ude00":{"x":[1,2.5e3,null,true]}, "n": -0}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := parseCompletion(body)
		if err != nil {
			return
		}
		req.scoreRequest(false)
		req.scoreRequest(true)
		pre, err := req.prefillBody("id", "h:1")
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(pre, &m); err != nil || string(m["max_tokens"]) != "1" || string(m["stream"]) != "false" {
			t.Fatalf("prefill body %s: %v", pre, err)
		}
		// The decode body is the client's, member for member, but for
		// kv_transfer_params.
		var want, got map[string]any
		json.Unmarshal(body, &want)
		delete(want, "kv_transfer_params")
		dec, err := req.decodeBody(nil)
		if err != nil || json.Unmarshal(dec, &got) != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("decode body %s from %s: %v", dec, body, err)
		}
		dec, err = req.decodeBody(json.RawMessage(`{"a":1}`))
		if err != nil || json.Unmarshal(dec, &got) != nil || fmt.Sprint(got["kv_transfer_params"]) != "map[a:1]" {
			t.Fatalf("decode body %s: %v", dec, err)
		}
	})
}

func TestScoreRequestPrompts(t *testing.T) {
	for _, tc := range []struct {
		body string
		chat bool
		want string // the score request, or "" when not scorable
	}{
		{`{"model":"m","prompt":"hi"}`, false, `m "hi" [] special salt=""`},
		{`{"model":"m","prompt":["hi"],"add_special_tokens":false,"cache_salt":"s"}`, false, `m "hi" [] plain salt="s"`},
		{`{"model":"m","prompt":[1,2,3]}`, false, `m <nil> [1 2 3] plain salt=""`},
		{`{"model":"m","prompt":[[4,5]]}`, false, `m <nil> [4 5] plain salt=""`},
		{`{"model":"m","prompt":["a","b"]}`, false, ""},
		{`{"model":"m","prompt":[[1],[2]]}`, false, ""},
		{`{"model":"m","prompt":[1,-2]}`, false, ""},
		{`{"model":"m","prompt":[4294967296]}`, false, ""},
		{`{"model":"m","prompt":[]}`, false, ""},
		{`{"model":"m","prompt":5}`, false, ""},
		{`{"prompt":"hi"}`, false, ""},
		{`{"model":"m","prompt":"hi","cache_salt":1}`, false, ""},
		{`{"model":"m","prompt":"hi"}`, true, ""},
	} {
		req, err := parseCompletion([]byte(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		if s, ok := req.scoreRequest(tc.chat); ok {
			prompt, special := "<nil>", "plain"
			if s.Prompt != nil {
				prompt = fmt.Sprintf("%q", *s.Prompt)
			}
			if s.AddSpecialTokens {
				special = "special"
			}
			got = fmt.Sprintf("%s %s %v %s salt=%q", s.Model, prompt, s.Tokens, special, s.CacheSalt)
		}
		if got != tc.want {
			t.Errorf("%s (chat %v): %q, want %q", tc.body, tc.chat, got, tc.want)
		}
	}
}

// TestProxyDecodeBreaksMidAnswer: a decode instance that drops the
// connection half-way through its answer. A stream ends with an error
// event; a whole answer is cut off, so the client sees it incomplete
// rather than a short body that looks whole.
func TestProxyDecodeBreaksMidAnswer(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if stream {
					w.Header().Set("Content-Type", "text/event-stream")
				} else {
					w.Header().Set("Content-Type", "application/json") // chunked: no length to fall short of
				}
				io.WriteString(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n")
				w.(http.Flusher).Flush()
				conn, _, err := http.NewResponseController(w).Hijack()
				if err == nil {
					conn.Close()
				}
			}))
			defer broken.Close()
			rig := newRig(t, 1, 0, func(c *proxyConfig) { c.Decode = []string{"d1=" + broken.URL + "=127.0.0.1:7001"} })
			ctx, cancel := context.WithTimeout(context.Background(), hang)
			defer cancel()
			body := fmt.Sprintf(`{"model":"m","prompt":"p","stream":%v}`, stream)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rig.srv.URL+"/v1/completions", strings.NewReader(body))
			resp, err := http.DefaultClient.Do(req)
			var out []byte
			if err == nil {
				out, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			if !stream {
				// The connection drops before or after the status,
				// depending on what the proxy had flushed: never a
				// complete answer.
				if err == nil {
					t.Errorf("a cut-off answer read as whole: %d %q", resp.StatusCode, out)
				}
				return
			}
			if err != nil || resp.StatusCode != 200 || !strings.HasPrefix(string(out), `data: {"choices":[{"text":"a"}]}`) ||
				!strings.Contains(string(out), `"stage":"decode"`) || !strings.Contains(string(out), "failed mid-answer") {
				t.Errorf("stream %q (%v), want the first event and a final error event", out, err)
			}
		})
	}
}
