package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"kvtier/internal/servetest"
)

var proxyListening = regexp.MustCompile(`msg="proxy listening" addr=(\S+)`)

// TestControllerProxyCommand runs `kvtier controller` as a process with
// --prefill, --decode and --proxy-listen, in front of two engines that
// stand in for vLLM (which cannot run here): the prefill one answers the
// producer's params only to a max_tokens=1 request telling it where to
// push, the decode one streams an answer naming the transfer it was
// given. A streamed completion through the binary's proxy carries the
// transfer from one to the other.
func TestControllerProxyCommand(t *testing.T) {
	prefill := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			MaxTokens int            `json:"max_tokens"`
			Stream    bool           `json:"stream"`
			KV        map[string]any `json:"kv_transfer_params"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		if req.MaxTokens != 1 || req.Stream || req.KV["do_remote_decode"] != true || req.KV["kvtier_push_to"] != "127.0.0.1:7470" {
			http.Error(w, fmt.Sprintf(`{"error":{"message":"bad prefill %+v"}}`, req), 400)
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"choices": []any{map[string]any{"text": "x"}},
			"kv_transfer_params": map[string]any{"do_remote_prefill": true, "kvtier_transfer_id": req.KV["kvtier_transfer_id"]}})
	}))
	defer prefill.Close()
	decode := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			KV map[string]any `json:"kv_transfer_params"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		if req.KV["do_remote_prefill"] != true {
			http.Error(w, `{"error":{"message":"no params"}}`, 400)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"choices\":[{\"text\":%q}]}\n\ndata: [DONE]\n\n", req.KV["kvtier_transfer_id"])
	}))
	defer decode.Close()

	bin, err := servetest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "controller", "--hash-seed", "0", "--listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0",
		"--prefill", "p1="+prefill.URL, "--decode", "d1="+decode.URL+"=127.0.0.1:7470")
	stderr := &servetest.Log{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })

	deadline := time.Now().Add(hang)
	var m []string
	for m == nil {
		select {
		case err := <-exited:
			t.Fatalf("controller exited before listening: %v\n%s", err, stderr)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy did not log its address within %v:\n%s", hang, stderr)
		}
		m = proxyListening.FindStringSubmatch(stderr.String())
	}
	resp, err := http.Post("http://"+m[1]+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","prompt":"hello","max_tokens":20,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !regexp.MustCompile(`^data: \{"choices":\[\{"text":"[0-9a-f]{32}"\}\]\}\n\ndata: \[DONE\]\n\n$`).Match(out) {
		t.Errorf("status %d, stream %q\n%s", resp.StatusCode, out, stderr)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("controller exited with %v after SIGTERM:\n%s", err, stderr)
		}
	case <-time.After(hang):
		t.Fatalf("controller still running %v after SIGTERM:\n%s", hang, stderr)
	}
}
