package main

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"kvtier/controller"
	"kvtier/internal/servetest"
)

// controllerFile sets every key of the controller's configuration.
const controllerFile = `
listen: 127.0.0.1:9001
grpc_listen: 127.0.0.1:9002
grpc_special_tokens: false
pods: [a=m=tcp://127.0.0.1:1, b=m=tcp://127.0.0.1:2]
pods_file: /file/pods
hash_seed: 42
block_size: 32
max_blocks: 1000
index_redis: redis://127.0.0.1:6379/1
scorer: coverage
tokenizers: [tiktoken:cl100k_base]
heartbeat_interval: 2s
missed_heartbeats: 5
log_level: debug
proxy_listen: 127.0.0.1:9003
prefill: [p=http://127.0.0.1:8100]
decode: [d=http://127.0.0.1:8200=127.0.0.1:7470]
prefill_timeout: 1m
decode_timeout: 5m
`

// TestControllerFlags checks that `kvtier controller` reads every key from
// --config, and that every key's flag, when given, replaces the file's value.
func TestControllerFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "controller.yaml")
	if err := os.WriteFile(path, []byte(controllerFile), 0o600); err != nil {
		t.Fatal(err)
	}
	fromFile := controllerConfig(t, "--config", path)
	fileSeed := "42"
	want := controller.Config{Listen: "127.0.0.1:9001", GRPCListen: "127.0.0.1:9002", GRPCSpecialTokens: false,
		Pods: []string{"a=m=tcp://127.0.0.1:1", "b=m=tcp://127.0.0.1:2"}, PodsFile: "/file/pods",
		HashSeed: &fileSeed, BlockSize: 32, MaxBlocks: 1000, IndexRedis: "redis://127.0.0.1:6379/1",
		Scorer: "coverage", Tokenizers: []string{"tiktoken:cl100k_base"}, HeartbeatInterval: 2 * time.Second,
		MissedHeartbeats: 5, LogLevel: "debug",
		ProxyListen: "127.0.0.1:9003", PrefillInstances: []string{"p=http://127.0.0.1:8100"},
		DecodeInstances: []string{"d=http://127.0.0.1:8200=127.0.0.1:7470"}, PrefillTimeout: time.Minute, DecodeTimeout: 5 * time.Minute}
	if !reflect.DeepEqual(fromFile, want) {
		t.Errorf("from the file:\n%+v, want\n%+v", fromFile, want)
	}

	fromFlags := controllerConfig(t, "--config", path, "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0",
		"--grpc-special-tokens=true", "--pod", "c=m=tcp://127.0.0.1:3", "--pods-file", "/flag/pods", "--hash-seed", "", "--block-size", "16",
		"--max-blocks", "2000", "--index-redis", "redis://127.0.0.1:6380", "--scorer", "block-hits",
		"--tokenizer", "m=tiktoken:o200k_base", "--tokenizer", "tiktoken:cl100k_base", "--heartbeat-interval", "500ms",
		"--missed-heartbeats", "2", "--log-level", "warn", "--proxy-listen", "127.0.0.1:0",
		"--prefill", "q=http://127.0.0.1:8101", "--decode", "e=http://127.0.0.1:8201=127.0.0.1:7471",
		"--prefill-timeout", "3s", "--decode-timeout", "4s")
	emptySeed := ""
	want = controller.Config{Listen: "127.0.0.1:0", GRPCListen: "127.0.0.1:0", GRPCSpecialTokens: true,
		Pods: []string{"c=m=tcp://127.0.0.1:3"}, PodsFile: "/flag/pods", HashSeed: &emptySeed, BlockSize: 16,
		MaxBlocks: 2000, IndexRedis: "redis://127.0.0.1:6380", Scorer: "block-hits",
		Tokenizers: []string{"m=tiktoken:o200k_base", "tiktoken:cl100k_base"}, HeartbeatInterval: 500 * time.Millisecond,
		MissedHeartbeats: 2, LogLevel: "warn",
		ProxyListen: "127.0.0.1:0", PrefillInstances: []string{"q=http://127.0.0.1:8101"},
		DecodeInstances: []string{"e=http://127.0.0.1:8201=127.0.0.1:7471"}, PrefillTimeout: 3 * time.Second, DecodeTimeout: 4 * time.Second}
	if !reflect.DeepEqual(fromFlags, want) {
		t.Errorf("with every flag:\n%+v, want\n%+v", fromFlags, want)
	}

	// Without --config, the defaults and the flags: the old command lines.
	got := controllerConfig(t, "--hash-seed", "0", "--pod", "a=m=tcp://127.0.0.1:1")
	if got.Listen != "127.0.0.1:7481" || got.Scorer != "longest-prefix" || *got.HashSeed != "0" || len(got.Pods) != 1 {
		t.Errorf("flags only: %+v", got)
	}
	if got := controllerConfig(t); got.HashSeed != nil {
		t.Errorf("no --hash-seed gave the seed %q, want none", *got.HashSeed)
	}
}

// controllerConfig parses `kvtier controller` arguments into its
// configuration, without running it.
func controllerConfig(t *testing.T, args ...string) controller.Config {
	t.Helper()
	cmd, f := newControllerCmd()
	if err := cmd.ParseFlags(args); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.load(cmd.Flags().Changed)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestControllerScorerHelpListsEveryScorer(t *testing.T) {
	cmd, _ := newControllerCmd()
	usage := cmd.Flags().Lookup("scorer").Usage
	for _, name := range []string{"longest-prefix", "tier-weighted", "block-hits", "coverage"} {
		if !strings.Contains(usage, name) {
			t.Errorf("--scorer help %q does not name %s", usage, name)
		}
	}
}

var controllerListening = regexp.MustCompile(`msg="controller listening" addr=(\S+)`)

// TestControllerCommandRuns runs the binary with a configuration file,
// checks it serves, and that SIGTERM stops it cleanly.
func TestControllerCommandRuns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "controller.yaml")
	if err := os.WriteFile(path, []byte("hash_seed: 0\npods: [a=m=tcp://127.0.0.1:1]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bin, err := servetest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "controller", "--config", path, "--listen", "127.0.0.1:0")
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
			t.Fatalf("controller did not log its address within %v:\n%s", hang, stderr)
		}
		m = controllerListening.FindStringSubmatch(stderr.String())
	}
	resp, err := http.Get("http://" + m[1] + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz: %v %v", resp, err)
	}
	resp.Body.Close()

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
	if log := stderr.String(); !strings.Contains(log, `msg="shutting down"`) || !strings.Contains(log, "msg=stopped") {
		t.Errorf("shutdown was not logged:\n%s", log)
	}
}

// TestControllerClusterTokenFromEnv checks that $KVTIER_CLUSTER_TOKEN
// sets cluster_token over the file's value, and that --cluster-token still
// wins over both.
func TestControllerClusterTokenFromEnv(t *testing.T) {
	path := filepath.Join(t.TempDir(), "controller.yaml")
	if err := os.WriteFile(path, []byte("cluster_token: from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KVTIER_CLUSTER_TOKEN", "")
	if got := controllerConfig(t, "--config", path).ClusterToken; got != "from-file" {
		t.Errorf("empty variable: %q, want the file's", got)
	}
	t.Setenv("KVTIER_CLUSTER_TOKEN", "from-env")
	if got := controllerConfig(t, "--config", path).ClusterToken; got != "from-env" {
		t.Errorf("with the variable: %q, want from-env", got)
	}
	if got := controllerConfig(t).ClusterToken; got != "from-env" {
		t.Errorf("without a file: %q, want from-env", got)
	}
	if got := controllerConfig(t, "--config", path, "--cluster-token", "from-flag").ClusterToken; got != "from-flag" {
		t.Errorf("with the flag: %q, want from-flag", got)
	}
}
