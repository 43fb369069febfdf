package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"kvtier/router/tokenize"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"kvtier/chunk"
	"kvtier/router/index"
)

const blockSize = 16

// fixture is a Handler over a real index where three pods hold leading
// prefixes of prompt of different lengths.
type fixture struct {
	h      *Handler
	ix     *index.Index
	pods   *index.Pods
	prompt []uint32 // 8 full blocks and a partial one
	hashes []uint64 // event hashes of prompt's blocks
}

// prefixes is how many leading blocks of the prompt each pod holds.
var prefixes = map[string]int{"pod-a": 8, "pod-b": 3, "pod-c": 1}

func newFixture(t testing.TB, scorer index.Scorer) *fixture {
	t.Helper()
	hasher, err := chunk.NewVLLMHasher("0", blockSize)
	if err != nil {
		t.Fatal(err)
	}
	ix, err := index.New(index.Config{MaxBlocks: 1 << 12})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{ix: ix, pods: index.NewPods(), prompt: tokens(8*blockSize + 5)}
	for _, b := range hasher.BlockHashes(nil, f.prompt, chunk.VLLMRequest{}) {
		f.hashes = append(f.hashes, chunk.EventHash(b))
	}
	for name, n := range prefixes {
		f.hold(t, name, index.GPU, f.hashes[:n])
	}
	f.h, err = New(Config{Index: ix, Pods: f.pods, Hasher: hasher, Scorer: scorer, MaxTokens: 1000, MaxBodyBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) hold(t testing.TB, pod string, tier index.Tier, hashes []uint64) {
	t.Helper()
	id, err := f.pods.Intern(pod)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.ix.Add(id, tier, hashes); err != nil {
		t.Fatal(err)
	}
}

func tokens(n int) []uint32 {
	ts := make([]uint32, n)
	for i := range ts {
		ts[i] = uint32(1000 + 7*i)
	}
	return ts
}

// post sends body to /v1/score and returns the status and raw answer.
func (f *fixture) post(t *testing.T, body string) (int, []byte) {
	t.Helper()
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/score", strings.NewReader(body)))
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	return rec.Code, rec.Body.Bytes()
}

func (f *fixture) score(t *testing.T, req map[string]any) ScoreResponse {
	t.Helper()
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	code, out := f.post(t, string(body))
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, out)
	}
	var resp ScoreResponse
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatalf("decoding %s: %v", out, err)
	}
	return resp
}

func checkScores(t *testing.T, got ScoreResponse, want map[string]float64, blocks int) {
	t.Helper()
	if got.Blocks != blocks {
		t.Errorf("blocks = %d, want %d", got.Blocks, blocks)
	}
	if fmt.Sprint(got.Scores) != fmt.Sprint(want) { // fmt sorts map keys
		t.Errorf("scores = %v, want %v", got.Scores, want)
	}
}

func TestScoreLongestPrefix(t *testing.T) {
	f := newFixture(t, nil)
	got := f.score(t, map[string]any{"model": "m", "tokens": f.prompt})
	checkScores(t, got, map[string]float64{"pod-a": 8, "pod-b": 3, "pod-c": 1}, 8)

	// A prompt that diverges in its third block keeps only two blocks.
	diverged := append([]uint32(nil), f.prompt...)
	diverged[2*blockSize+1]++
	got = f.score(t, map[string]any{"model": "m", "tokens": diverged})
	checkScores(t, got, map[string]float64{"pod-a": 2, "pod-b": 2, "pod-c": 1}, 8)
}

func TestScoreCandidates(t *testing.T) {
	f := newFixture(t, nil)
	got := f.score(t, map[string]any{"model": "m", "tokens": f.prompt, "pods": []string{"pod-b", "pod-x", "pod-b", "pod-c"}})
	checkScores(t, got, map[string]float64{"pod-b": 3, "pod-c": 1, "pod-x": 0}, 8)

	got = f.score(t, map[string]any{"model": "m", "tokens": f.prompt, "pods": []string{"nobody"}})
	checkScores(t, got, map[string]float64{"nobody": 0}, 8)
}

// TestScoreExtraKeys checks that a LoRA name or a cache salt changes every
// block key, as in vLLM, so a prefix cached without them does not match.
func TestScoreExtraKeys(t *testing.T) {
	f := newFixture(t, nil)
	for _, extra := range []map[string]any{{"lora_name": "sql-adapter"}, {"cache_salt": "tenant-7"}} {
		req := map[string]any{"model": "m", "tokens": f.prompt, "pods": []string{"pod-a", "pod-b"}}
		for k, v := range extra {
			req[k] = v
		}
		got := f.score(t, req)
		checkScores(t, got, map[string]float64{"pod-a": 0, "pod-b": 0}, 8)
	}
	// A pod that cached the prompt under the salt scores with it.
	hasher, _ := chunk.NewVLLMHasher("0", blockSize)
	salted := hasher.BlockHashes(nil, f.prompt, chunk.VLLMRequest{CacheSalt: "tenant-7"})
	f.hold(t, "pod-s", index.GPU, []uint64{chunk.EventHash(salted[0]), chunk.EventHash(salted[1])})
	got := f.score(t, map[string]any{"model": "m", "tokens": f.prompt, "cache_salt": "tenant-7"})
	checkScores(t, got, map[string]float64{"pod-s": 2}, 8)
}

func TestScoreTierWeighted(t *testing.T) {
	f := newFixture(t, index.TierWeightedPrefix{Weights: index.DefaultTierWeights()})
	f.hold(t, "pod-d", index.Disk, f.hashes[:4])
	got := f.score(t, map[string]any{"model": "m", "tokens": f.prompt, "pods": []string{"pod-a", "pod-d"}})
	checkScores(t, got, map[string]float64{"pod-a": 8, "pod-d": 4 * index.DefaultTierWeights()[index.Disk]}, 8)
}

func TestShortPromptHasNoBlocks(t *testing.T) {
	f := newFixture(t, nil)
	got := f.score(t, map[string]any{"model": "m", "tokens": f.prompt[:blockSize-1]})
	checkScores(t, got, map[string]float64{}, 0)
}

func TestBadRequests(t *testing.T) {
	f := newFixture(t, nil)
	toks := func(n int) string {
		b, _ := json.Marshal(tokens(n))
		return string(b)
	}
	for _, tc := range []struct {
		name, body string
		status     int
		errHas     string
	}{
		{"bad json", `{"model":"m","tokens":[1,2`, 400, "decoding request"},
		{"not an object", `[1,2,3]`, 400, "decoding request"},
		{"unknown field", `{"model":"m","tokens":[1],"temperature":1}`, 400, "unknown field"},
		{"trailing data", `{"model":"m","tokens":[1]} {}`, 400, "trailing data"},
		{"missing tokens", `{"model":"m"}`, 400, "tokens are required"},
		{"empty tokens", `{"model":"m","tokens":[]}`, 400, "tokens are required"},
		{"null tokens", `{"model":"m","tokens":null}`, 400, "tokens are required"},
		{"prompt string", `{"model":"m","prompt":"hello"}`, 400, "tokens"},
		{"missing model", `{"tokens":[1,2]}`, 400, "model is required"},
		{"negative token", `{"model":"m","tokens":[-1]}`, 400, "decoding request"},
		{"token overflow", `{"model":"m","tokens":[4294967296]}`, 400, "decoding request"},
		{"string token", `{"model":"m","tokens":["a"]}`, 400, "decoding request"},
		{"empty pod name", `{"model":"m","tokens":[1],"pods":[""]}`, 400, "empty pod name"},
		{"too many tokens", `{"model":"m","tokens":` + toks(1001) + `}`, 400, "too many tokens"},
		{"negative group", `{"model":"m","tokens":[1],"group_idx":-1}`, 400, "group_idx -1 out of range"},
		{"group too large", `{"model":"m","tokens":[1],"group_idx":65536}`, 400, "out of range"},
		{"special tokens without prompt", `{"model":"m","tokens":[1],"add_special_tokens":true}`, 400, "add_special_tokens applies to a prompt"},
		{"body too large", `{"model":"m","tokens":[` + strings.Repeat("1,", 40<<10) + `1]}`, 413, "too large"},
		{"prompt too large", `{"model":"m","prompt":"` + strings.Repeat("a", 100<<10) + `"}`, 413, "too large"},
		{"too large after the object", `{"model":"m","tokens":[1]}` + strings.Repeat(" ", 100<<10) + `x`, 413, "too large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := f.post(t, tc.body)
			var e errorResponse
			if err := json.Unmarshal(out, &e); err != nil {
				t.Fatalf("error body %q is not JSON: %v", out, err)
			}
			if code != tc.status || !strings.Contains(e.Error, tc.errHas) {
				t.Errorf("status %d error %q, want %d containing %q", code, e.Error, tc.status, tc.errHas)
			}
		})
	}
	// The largest allowed request still succeeds.
	if code, out := f.post(t, `{"model":"m","tokens":`+toks(1000)+`}`); code != 200 {
		t.Errorf("1000 tokens: status %d: %s", code, out)
	}
}

func TestMethodsAndHealth(t *testing.T) {
	f := newFixture(t, nil)
	for _, tc := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{http.MethodGet, "/v1/score", 405, "POST"},
		{http.MethodPut, "/v1/score", 405, "POST"},
		{http.MethodPost, "/healthz", 405, "GET, HEAD"},
		{http.MethodGet, "/healthz", 200, ""},
		{http.MethodGet, "/nope", 404, ""},
	} {
		rec := httptest.NewRecorder()
		f.h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, nil))
		if rec.Code != tc.status || rec.Header().Get("Allow") != tc.allow {
			t.Errorf("%s %s: status %d Allow %q, want %d %q", tc.method, tc.path, rec.Code, rec.Header().Get("Allow"), tc.status, tc.allow)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	f := newFixture(t, nil)
	hasher, _ := chunk.NewVLLMHasher("0", blockSize)
	for _, cfg := range []Config{
		{Pods: f.pods, Hasher: hasher},
		{Index: f.ix, Hasher: hasher},
		{Index: f.ix, Pods: f.pods},
		{Index: f.ix, Pods: f.pods, Hasher: hasher, MaxTokens: -1},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted a bad config", cfg)
		}
	}
}

// TestScoreAllocs checks that hashing and scoring a prompt cost the same
// (zero) allocations whatever its length, once the scratch buffers are warm.
func TestScoreAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	f := newFixture(t, nil)
	s := new(scratch)
	s.req.Tokens = tokens(2048)
	copy(s.req.Tokens, f.prompt)
	candidates := []index.PodID{0, 1, 2}
	f.h.score(s, candidates) // warm the buffers
	if n := testing.AllocsPerRun(50, func() { f.h.score(s, candidates) }); n != 0 {
		t.Errorf("score allocates %v times per 128-block prompt with candidates", n)
	}
	f.h.score(s, nil)
	if n := testing.AllocsPerRun(50, func() { f.h.score(s, nil) }); n != 0 {
		t.Errorf("score allocates %v times per 128-block prompt", n)
	}
	if len(s.scores) != 3 || s.scores[0].Score == 0 {
		t.Errorf("scores = %v, want the three fixture pods", s.scores)
	}
}

func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"model":"m","tokens":[1,2,3],"pods":["a"],"lora_name":"l","cache_salt":"s"}`))
	f.Add([]byte(`{"model":"m","tokens":[]}`))
	f.Add([]byte(`{"model":"m","prompt":"x"}`))
	f.Add([]byte(`{"model":"m","tokens":[1e3, -0, 4294967295]}`))
	f.Add([]byte(`nul`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var req ScoreRequest
		err := decodeRequest(bytes.NewReader(data), &req, 64)
		if err != nil {
			return
		}
		// Exactly one of prompt and tokens, within bounds.
		if req.Model == "" || (len(req.Tokens) == 0) == (req.Prompt == nil) || len(req.Tokens) > 64 {
			t.Fatalf("accepted an invalid request %+v from %q", req, data)
		}
	})
}

// benchFixture is the fixture plus pods more pods holding all 128 blocks
// of a 2,048-token prompt (which extends the fixture's prompt, so the
// fixture's three pods score too).
func benchFixture(b *testing.B, pods int) (*fixture, []uint32) {
	f := newFixture(b, nil)
	f.h.maxTokens = 4096
	prompt := tokens(2048)
	var hashes []uint64
	for _, h := range f.h.hasher.BlockHashes(nil, prompt, chunk.VLLMRequest{}) {
		hashes = append(hashes, chunk.EventHash(h))
	}
	for p := range pods {
		f.hold(b, fmt.Sprintf("bench-%d", p), index.GPU, hashes)
	}
	return f, prompt
}

func BenchmarkScore(b *testing.B) {
	for _, pods := range []int{1, 8} {
		b.Run(fmt.Sprintf("2048tokens/%dpods", pods), func(b *testing.B) {
			f, prompt := benchFixture(b, pods)
			s := &scratch{req: ScoreRequest{Tokens: prompt}}
			b.ReportAllocs()
			for b.Loop() {
				f.h.score(s, nil)
			}
			if len(s.scores) != pods+len(prefixes) {
				b.Fatalf("scored %d pods, want %d", len(s.scores), pods+len(prefixes))
			}
		})
	}
	b.Run("http/2048tokens/8pods", func(b *testing.B) {
		f, prompt := benchFixture(b, 8)
		body, _ := json.Marshal(map[string]any{"model": "m", "tokens": prompt})
		b.ReportAllocs()
		for b.Loop() {
			rec := httptest.NewRecorder()
			f.h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/score", bytes.NewReader(body)))
			if rec.Code != 200 {
				b.Fatal(rec.Body.String())
			}
		}
	})
}

// TestScoresOnlyPodsOfTheModel: vLLM's block hashes ignore the model, so
// a pod serving another model holds the "same" blocks; once the router
// knows the pods' models, it scores only pods of the requested one.
func TestScoresOnlyPodsOfTheModel(t *testing.T) {
	f := newFixture(t, nil)
	all := f.score(t, map[string]any{"model": "m", "tokens": f.prompt})
	checkScores(t, all, map[string]float64{"pod-a": 8, "pod-b": 3, "pod-c": 1}, 8)

	a, _ := f.pods.ID("pod-a")
	b, _ := f.pods.ID("pod-b")
	f.pods.SetModel(a, "other-model")
	f.pods.SetModel(b, "m")
	got := f.score(t, map[string]any{"model": "m", "tokens": f.prompt})
	checkScores(t, got, map[string]float64{"pod-b": 3, "pod-c": 1}, 8) // pod-c's model is unknown: kept
	named := f.score(t, map[string]any{"model": "m", "tokens": f.prompt, "pods": []string{"pod-a", "pod-b"}})
	checkScores(t, named, map[string]float64{"pod-a": 0, "pod-b": 3}, 8)
}

// TestPromptsAreTokenizedWithTheModelsTokenizer scores a prompt given as
// text: the tokenizer of the model turns it into the same tokens a client
// would have sent, and the scores match.
func TestPromptsAreTokenizedWithTheModelsTokenizer(t *testing.T) {
	f := newFixture(t, nil)
	tok, err := tokenize.Open("tiktoken:cl100k_base")
	if err != nil {
		t.Fatal(err)
	}
	pool := tokenize.NewPool(tok, tokenize.PoolOptions{})
	f.h.tokenizer = func(model string) *tokenize.Pool {
		if model == "m" {
			return pool
		}
		return nil
	}
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 20)
	ids, err := tok.Encode(text, nil)
	if err != nil {
		t.Fatal(err)
	}
	var hashes []uint64
	for _, b := range f.h.hasher.BlockHashes(nil, ids, chunk.VLLMRequest{}) {
		hashes = append(hashes, chunk.EventHash(b))
	}
	f.hold(t, "pod-text", index.GPU, hashes[:5])
	got := f.score(t, map[string]any{"model": "m", "prompt": text, "pods": []string{"pod-text", "pod-a"}})
	checkScores(t, got, map[string]float64{"pod-text": 5, "pod-a": 0}, len(ids)/blockSize)

	for body, want := range map[string]string{
		`{"model":"other","prompt":"hello"}`:          "no tokenizer",
		`{"model":"m","prompt":"hello","tokens":[1]}`: "not both",
		`{"model":"m","prompt":""}`:                   "no tokens",
	} {
		code, out := f.post(t, body)
		if code != http.StatusBadRequest || !strings.Contains(string(out), want) {
			t.Errorf("%s: %d %s, want 400 mentioning %q", body, code, out, want)
		}
	}
	// The Go entry point used by the gRPC service answers the same.
	resp, err := f.h.Score(context.Background(), ScoreRequest{Model: "m", Prompt: &text, Pods: []string{"pod-text"}})
	if err != nil || resp.Scores["pod-text"] != 5 {
		t.Errorf("Score: %+v %v", resp, err)
	}
	if _, err := f.h.Score(context.Background(), ScoreRequest{Model: ""}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Score of an empty request: %v", err)
	}
}

// TestModelNoPodServesScoresNobody: once pods' models are known, a request
// for a model none of them serves scores nobody, on a fresh handler too
// (whose scratch slices are still nil).
func TestModelNoPodServesScoresNobody(t *testing.T) {
	f := newFixture(t, nil)
	for _, name := range []string{"pod-a", "pod-b", "pod-c"} {
		id, _ := f.pods.ID(name)
		f.pods.SetModel(id, "m")
	}
	got := f.score(t, map[string]any{"model": "other", "tokens": f.prompt})
	checkScores(t, got, map[string]float64{}, 8)
	got = f.score(t, map[string]any{"model": "other", "tokens": f.prompt, "pods": []string{"pod-a"}})
	checkScores(t, got, map[string]float64{"pod-a": 0}, 8)
}

// TestScoreByGroup: a request scores the KV-cache group it names (group 0
// by default); holdings of the same blocks in another group do not count.
func TestScoreByGroup(t *testing.T) {
	f := newFixture(t, nil)
	g2 := append([]uint64(nil), f.hashes[:6]...)
	index.GroupKeys(g2, 2)
	f.hold(t, "pod-g2", index.GPU, g2)

	got := f.score(t, map[string]any{"model": "m", "tokens": f.prompt})
	checkScores(t, got, map[string]float64{"pod-a": 8, "pod-b": 3, "pod-c": 1}, 8)
	got = f.score(t, map[string]any{"model": "m", "tokens": f.prompt, "group_idx": 0})
	checkScores(t, got, map[string]float64{"pod-a": 8, "pod-b": 3, "pod-c": 1}, 8)
	got = f.score(t, map[string]any{"model": "m", "tokens": f.prompt, "group_idx": 2})
	checkScores(t, got, map[string]float64{"pod-g2": 6}, 8)
	got = f.score(t, map[string]any{"model": "m", "tokens": f.prompt, "group_idx": 1, "pods": []string{"pod-a", "pod-g2"}})
	checkScores(t, got, map[string]float64{"pod-a": 0, "pod-g2": 0}, 8)
}

// TestAddSpecialTokens: with add_special_tokens the prompt gets the
// tokenizer's post-processor tokens (bos-toy's BOS, id 0), without it not.
func TestAddSpecialTokens(t *testing.T) {
	f := newFixture(t, nil)
	tok, err := tokenize.LoadHF("../tokenize/testdata/bos-toy/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	pool := tokenize.NewPool(tok, tokenize.PoolOptions{})
	f.h.tokenizer = func(string) *tokenize.Pool { return pool }
	text := strings.Repeat("abcd", 8) // 32 ids, two blocks; 33 with BOS
	plain, _ := pool.Encode(context.Background(), text, nil)
	withBOS, _ := pool.EncodeSpecial(context.Background(), text, nil)
	hashesOf := func(ids []uint32) []uint64 {
		var out []uint64
		for _, b := range f.h.hasher.BlockHashes(nil, ids, chunk.VLLMRequest{}) {
			out = append(out, chunk.EventHash(b))
		}
		return out
	}
	f.hold(t, "pod-plain", index.GPU, hashesOf(plain))
	f.hold(t, "pod-bos", index.GPU, hashesOf(withBOS))
	pods := []string{"pod-plain", "pod-bos"}
	got := f.score(t, map[string]any{"model": "m", "prompt": text, "pods": pods})
	checkScores(t, got, map[string]float64{"pod-plain": 2, "pod-bos": 0}, 2)
	got = f.score(t, map[string]any{"model": "m", "prompt": text, "pods": pods, "add_special_tokens": true})
	checkScores(t, got, map[string]float64{"pod-plain": 0, "pod-bos": 2}, 2)
}
