package controller

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	goredis "github.com/redis/go-redis/v9"

	"kvtier/chunk"
	"kvtier/internal/msgpacktest"
	"kvtier/internal/redistest"
	"kvtier/internal/servetest"
	"kvtier/router/api"
	"kvtier/router/index"
	"kvtier/router/ingest"
)

func TestParsePods(t *testing.T) {
	eps, err := parsePods([]string{
		"pod-a=meta-llama/Llama-3.1-8B=tcp://10.0.0.7:5557",
		"pod-b=org/m@v=2=tcp://10.0.0.8:5557=tcp://10.0.0.8:5558",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []ingest.Endpoint{
		{Pod: "pod-a", Model: "meta-llama/Llama-3.1-8B", Address: "tcp://10.0.0.7:5557"},
		{Pod: "pod-b", Model: "org/m@v=2", Address: "tcp://10.0.0.8:5557", Replay: "tcp://10.0.0.8:5558"},
	}
	if !slices.Equal(eps, want) {
		t.Errorf("parsePods =\n%+v, want\n%+v", eps, want)
	}
	if eps, err := parsePods(nil); err != nil || len(eps) != 0 {
		t.Errorf("no pods (daemons register instead): %v %v", eps, err)
	}
	for _, bad := range [][]string{
		{"pod-a"},
		{"pod-a=m"},
		{"pod-a=tcp://h:1"},
		{"=m=tcp://h:1"},
		{"pod-a==tcp://h:1"},
		{"pod-a=m=http://h:1"},
		{"pod-a=m=tcp://h:1=replay"},
		{"pod-a=m=tcp://h:1", "pod-a=m=tcp://h:2"},
	} {
		if eps, err := parsePods(bad); err == nil {
			t.Errorf("parsePods(%q) = %+v, want an error", bad, eps)
		}
	}
}

// hang bounds every wait on the controller. It only catches a controller
// that hangs; no test asserts how fast anything is.
const hang = 30 * time.Second

// validConfig is a configuration Run accepts.
func validConfig() Config {
	c := Default()
	seed := "0"
	c.Listen, c.HashSeed, c.Pods = "127.0.0.1:0", &seed, []string{"p=m=tcp://127.0.0.1:1"}
	return c
}

func TestRunRejectsBadConfig(t *testing.T) {
	for name, mutate := range map[string]func(*Config){
		"hash-seed":   func(c *Config) { c.HashSeed = nil },
		"pod":         func(c *Config) { c.Pods = []string{"not a pod"} },
		"scorer":      func(c *Config) { c.Scorer = "random" },
		"block-size":  func(c *Config) { c.BlockSize = 0 },
		"max-blocks":  func(c *Config) { c.MaxBlocks = 0 },
		"log-level":   func(c *Config) { c.LogLevel = "loud" },
		"listen":      func(c *Config) { c.Listen = "127.0.0.1:-1" },
		"grpc-listen": func(c *Config) { c.GRPCListen = "127.0.0.1:-1" },
		"pods-file":   func(c *Config) { c.PodsFile = filepath.Join(t.TempDir(), "missing") },
		"tokenizer":   func(c *Config) { c.Tokenizers = []string{"nosuch:x"} },
	} {
		c := validConfig()
		mutate(&c)
		err := Run(context.Background(), func() {}, c, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--"+name) {
			t.Errorf("%s: Run = %v, want an error naming it", name, err)
		}
	}
}

// vllmBlockStored encodes an EventBatch holding one BlockStored event as
// vLLM's msgspec publisher does with array_like structs (the tagged-array
// encoding): [ts, [["BlockStored", hashes, parent, tokens, block_size,
// lora_id, medium]], dp_rank].
func vllmBlockStored(t *testing.T, hashes []uint64, tokens []uint32, blockSize int) []byte {
	t.Helper()
	event := []any{"BlockStored", hashes, nil, tokens, blockSize, nil, nil}
	b, err := msgpacktest.Encode([]any{1700000000.25, []any{event}, 0}, true)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var controllerListening = regexp.MustCompile(`msg="controller listening" addr=(\S+)`)

// TestControllerServesScoresFromEvents runs the controller against a
// real ZMQ publisher emitting vLLM's BlockStored frames for a prompt, and
// checks that /v1/score then gives the publishing pod the whole prompt.
func TestControllerServesScoresFromEvents(t *testing.T) {
	t.Run("memory", func(t *testing.T) { controllerServesScores(t) })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		url := srv.URL()
		controllerServesScores(t, func(c *Config) { c.IndexRedis = url })
		// The blocks are in Redis, where another controller would see them.
		opts, _ := goredis.ParseURL(url)
		rdb := goredis.NewClient(opts)
		defer rdb.Close()
		keys, err := rdb.Keys(context.Background(), "kvtier:b:*").Result()
		if err != nil || len(keys) != 10 {
			t.Errorf("Redis holds %d block keys (%v), want the prompt's 10", len(keys), err)
		}
	})
}

// controllerServesScores runs a controller, configured further by with,
// against a publisher and checks the pod scores the whole prompt.
func controllerServesScores(t *testing.T, with ...func(*Config)) {
	const blockSize = 16
	prompt := make([]uint32, 10*blockSize+3)
	for i := range prompt {
		prompt[i] = uint32(50000 + 13*i)
	}
	hasher, err := chunk.NewVLLMHasher("0", blockSize)
	if err != nil {
		t.Fatal(err)
	}
	var hashes []uint64
	for _, b := range hasher.BlockHashes(nil, prompt, chunk.VLLMRequest{}) {
		hashes = append(hashes, chunk.EventHash(b))
	}
	payload := vllmBlockStored(t, hashes, prompt[:len(hashes)*blockSize], blockSize)

	pub := zmq4.NewPub(context.Background())
	defer pub.Close()
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}

	cfg := validConfig()
	cfg.Pods = []string{"pod-a=m=tcp://" + pub.Addr().String()}
	for _, set := range with {
		set(&cfg)
	}
	logs := &servetest.Log{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exited := make(chan error, 1)
	go func() { exited <- Run(ctx, func() {}, cfg, logs) }()
	url := waitListening(t, logs, exited)

	// A SUB socket misses what is published before it has connected, so
	// keep publishing (with increasing sequence numbers, as vLLM does)
	// until the score shows the blocks.
	body, err := json.Marshal(map[string]any{"model": "m", "tokens": prompt, "pods": []string{"pod-a", "pod-z"}})
	if err != nil {
		t.Fatal(err)
	}
	var got api.ScoreResponse
	deadline := time.Now().Add(hang)
	for seq := uint64(0); ; seq++ {
		msg := zmq4.NewMsgFrom([]byte("kv@pod-a@m"), binary.BigEndian.AppendUint64(nil, seq), payload)
		if err := pub.Send(msg); err != nil {
			t.Fatal(err)
		}
		got = scoreOnce(t, url, body)
		if got.Scores["pod-a"] == float64(len(hashes)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod-a never scored the prompt within %v; last answer %+v\n%s", hang, got, logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got.Blocks != 10 || got.Scores["pod-z"] != 0 || len(got.Scores) != 2 {
		t.Errorf("score = %+v, want 10 blocks, pod-a 10, pod-z 0", got)
	}

	cancel()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("Run returned %v after its context ended:\n%s", err, logs)
		}
	case <-time.After(hang):
		t.Fatalf("controller still running %v after its context ended:\n%s", hang, logs)
	}
	log := logs.String()
	if !strings.Contains(log, `msg="shutting down"`) || !strings.Contains(log, "msg=stopped") {
		t.Errorf("shutdown was not logged:\n%s", log)
	}
}

// waitListening returns the score API's URL once the controller logs it.
func waitListening(t *testing.T, logs *servetest.Log, exited <-chan error) string {
	t.Helper()
	deadline := time.Now().Add(hang)
	for {
		if m := controllerListening.FindStringSubmatch(logs.String()); m != nil {
			return "http://" + m[1]
		}
		select {
		case err := <-exited:
			t.Fatalf("controller exited before listening: %v\n%s", err, logs)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("controller did not log its address within %v:\n%s", hang, logs)
		}
	}
}

func scoreOnce(t *testing.T, url string, body []byte) api.ScoreResponse {
	t.Helper()
	resp, err := http.Post(url+"/v1/score", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/score: %d %v: %s", resp.StatusCode, err, out)
	}
	var r api.ScoreResponse
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("decoding %s: %v", out, err)
	}
	return r
}

func TestParseTokenizers(t *testing.T) {
	pick, err := parseTokenizers([]string{"tiktoken:cl100k_base", "gpt-x=tiktoken:o200k_base"})
	if err != nil {
		t.Fatal(err)
	}
	if pick("gpt-x").Tokenizer().Name() == pick("anything").Tokenizer().Name() {
		t.Error("the model's own tokenizer is not used")
	}
	for _, bad := range [][]string{{"nosuch:x"}, {"m=tiktoken:cl100k_base", "m=tiktoken:o200k_base"}, {"hf:/does/not/exist.json"}} {
		if _, err := parseTokenizers(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if pick, err := parseTokenizers(nil); err != nil || pick != nil {
		t.Errorf("no --tokenizer: %v %v", pick != nil, err)
	}
}

func TestPodsFileIsWatched(t *testing.T) {
	podsFilePoll = 20 * time.Millisecond
	dir := t.TempDir()
	file := filepath.Join(dir, "pods")
	write := func(s string) {
		if err := os.WriteFile(file+".tmp", []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(file+".tmp", file); err != nil {
			t.Fatal(err)
		}
	}
	write("# fleet\npod-a=m=tcp://127.0.0.1:1\n\n")
	eps, loaded, err := loadPods(nil, file)
	if err != nil || len(eps) != 1 || eps[0].Pod != "pod-a" || eps[0].Model != "m" {
		t.Fatalf("loadPods: %+v %v", eps, err)
	}
	ix, _ := index.New(index.Config{MaxBlocks: 1024})
	pods := index.NewPods()
	sub, err := ingest.New(ingest.Config{Endpoints: eps}, ix, pods)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); sub.Close() }()
	if err := sub.Start(ctx); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	go watchPods(ctx, nil, file, loaded, sub, log)

	wait := func(what string, cond func([]ingest.Endpoint) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond(sub.Endpoints()) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %+v", what, sub.Endpoints())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	write("pod-a=m=tcp://127.0.0.1:1\npod-b=m=tcp://127.0.0.1:2\n")
	wait("pod-b", func(e []ingest.Endpoint) bool { return len(e) == 2 })
	write("not a pod line\n") // rejected: the pods stay
	time.Sleep(100 * time.Millisecond)
	if len(sub.Endpoints()) != 2 {
		t.Fatalf("a bad file changed the pods: %+v", sub.Endpoints())
	}
	write("pod-b=m=tcp://127.0.0.1:2\n")
	wait("pod-a's removal", func(e []ingest.Endpoint) bool { return len(e) == 1 && e[0].Pod == "pod-b" })
}

// TestEveryScorerIsSelectable configures the controller with each scorer
// the index registers and checks its score API then scores a pod holding
// the prompt's first blocks above 0.
func TestEveryScorerIsSelectable(t *testing.T) {
	prompt := make([]uint32, 4*16)
	for i := range prompt {
		prompt[i] = uint32(7 + 31*i)
	}
	for _, name := range index.ScorerNames() {
		cfg := validConfig()
		cfg.Scorer = name
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		c, err := open(cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		hasher, _ := chunk.NewVLLMHasher(*cfg.HashSeed, cfg.BlockSize)
		var hashes []uint64
		for _, b := range hasher.BlockHashes(nil, prompt, chunk.VLLMRequest{}) {
			hashes = append(hashes, chunk.EventHash(b))
		}
		id, _ := c.pods.Intern("p")
		if err := c.ix.Add(id, index.GPU, hashes[:2]); err != nil {
			t.Fatal(err)
		}
		got, err := c.handler.Score(context.Background(), api.ScoreRequest{Model: "m", Tokens: prompt, Pods: []string{"p", "q"}})
		if err != nil || got.Scores["p"] <= 0 || got.Scores["q"] != 0 {
			t.Errorf("%s: scores %+v (%v), want p above 0 and q at 0", name, got, err)
		}
		c.sub.Close()
		c.closeIndex()
	}
}
