package controller

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"kvtier/chunk"
	"kvtier/internal/servetest"
)

var proxyListening = regexp.MustCompile(`msg="proxy listening" addr=(\S+)`)

// TestRunProxyRoutesByEvents runs the controller with the proxy on its own
// address, prefill instances named after the index's pods, and a ZMQ
// publisher announcing that pod-b holds a prompt: the proxy then sends
// that prompt's prefill to pod-b, every time.
func TestRunProxyRoutesByEvents(t *testing.T) {
	const blockSize = 16
	prompt := make([]uint32, 6*blockSize)
	for i := range prompt {
		prompt[i] = uint32(70000 + 11*i)
	}
	hasher, err := chunk.NewVLLMHasher("0", blockSize)
	if err != nil {
		t.Fatal(err)
	}
	var hashes []uint64
	for _, b := range hasher.BlockHashes(nil, prompt, chunk.VLLMRequest{}) {
		hashes = append(hashes, chunk.EventHash(b))
	}
	payload := vllmBlockStored(t, hashes, prompt, blockSize)
	pub := zmq4.NewPub(context.Background())
	defer pub.Close()
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}

	pa, pb := newFakeEngine(t, "pod-a", "prefill"), newFakeEngine(t, "pod-b", "prefill")
	d1 := newFakeEngine(t, "d1", "decode")
	cfg := validConfig()
	cfg.Pods = []string{"pod-a=m=tcp://127.0.0.1:1", "pod-b=m=tcp://" + pub.Addr().String()}
	cfg.ProxyListen = "127.0.0.1:0"
	cfg.PrefillInstances = []string{pa.spec(), pb.spec()}
	cfg.DecodeInstances = []string{d1.spec()}
	logs := &servetest.Log{}
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan error, 1)
	go func() { exited <- Run(ctx, func() {}, cfg, logs) }()
	scoreURL := waitListening(t, logs, exited)
	proxyURL := waitProxy(t, logs)

	scoreBody, _ := json.Marshal(map[string]any{"model": "m", "tokens": prompt, "pods": []string{"pod-b"}})
	deadline := time.Now().Add(hang)
	for seq := uint64(0); scoreOnce(t, scoreURL, scoreBody).Scores["pod-b"] != float64(len(hashes)); seq++ {
		if err := pub.Send(zmq4.NewMsgFrom([]byte("kv@pod-b@m"), binary.BigEndian.AppendUint64(nil, seq), payload)); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod-b never scored the prompt:\n%s", logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": 8})
	for range 4 {
		resp, err := http.Post(proxyURL+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Kvtier-Prefill") != "pod-b" {
			t.Fatalf("status %d, prefill %q, want pod-b: %s", resp.StatusCode, resp.Header.Get("X-Kvtier-Prefill"), out)
		}
	}
	if len(pa.seen()) != 0 || len(pb.seen()) != 4 || len(d1.seen()) != 4 {
		t.Errorf("requests: pod-a %d, pod-b %d, d1 %d; want 0, 4, 4", len(pa.seen()), len(pb.seen()), len(d1.seen()))
	}
	cancel()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("Run: %v\n%s", err, logs)
		}
	case <-time.After(hang):
		t.Fatalf("controller still running after its context ended:\n%s", logs)
	}
}

// TestRunProxyOnControllerAddress: without proxy_listen the proxy's
// routes share the score API's address.
func TestRunProxyOnControllerAddress(t *testing.T) {
	p1, d1 := newFakeEngine(t, "p1", "prefill"), newFakeEngine(t, "d1", "decode")
	cfg := validConfig()
	cfg.PrefillInstances, cfg.DecodeInstances = []string{p1.spec()}, []string{d1.spec()}
	logs := &servetest.Log{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exited := make(chan error, 1)
	go func() { exited <- Run(ctx, func() {}, cfg, logs) }()
	url := waitListening(t, logs, exited)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Kvtier-Decode") != "d1" {
		t.Errorf("status %d: %s", resp.StatusCode, out)
	}
	cancel()
	<-exited
}

func waitProxy(t *testing.T, logs *servetest.Log) string {
	t.Helper()
	deadline := time.Now().Add(hang)
	for time.Now().Before(deadline) {
		if m := proxyListening.FindStringSubmatch(logs.String()); m != nil {
			return "http://" + m[1]
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the proxy did not log its address:\n%s", logs)
	return ""
}

func TestRunRejectsBadProxyConfig(t *testing.T) {
	for name, mutate := range map[string]func(*Config){
		"prefill":         func(c *Config) { c.DecodeInstances = []string{"d=http://h:1=h:2"} },
		"decode":          func(c *Config) { c.PrefillInstances = []string{"p=http://h:1"} },
		"proxy-listen":    func(c *Config) { c.ProxyListen = "127.0.0.1:0" },
		"prefill-timeout": func(c *Config) { c.PrefillTimeout = 0 },
		"decode-timeout":  func(c *Config) { c.DecodeTimeout = -time.Second },
	} {
		c := validConfig()
		mutate(&c)
		err := Run(context.Background(), func() {}, c, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--"+name) {
			t.Errorf("%s: Run = %v, want an error naming it", name, err)
		}
	}
	c := validConfig()
	c.PrefillInstances, c.DecodeInstances = []string{"p=http://h:1"}, []string{"d=http://h:1=h:2"}
	c.ProxyListen = "127.0.0.1:-1"
	if err := Run(context.Background(), func() {}, c, io.Discard); err == nil || !strings.Contains(err.Error(), "--proxy-listen") {
		t.Errorf("unusable proxy_listen: Run = %v", err)
	}
}
