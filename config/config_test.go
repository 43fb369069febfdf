package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// loadWith loads with exactly the given environment, as root so that
// data_dir is predictable.
func loadWith(t *testing.T, path string, environ ...string) (Config, error) {
	t.Helper()
	c, _, err := load(path, environ, 0)
	return c, err
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaults(t *testing.T) {
	c, err := loadWith(t, "")
	if err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	want := Config{
		ChunkSize:         256,
		LocalCPU:          true,
		MaxLocalCPUSize:   5.0,
		RemoteSerde:       "raw",
		RemoteTimeout:     100 * time.Millisecond,
		CachePolicy:       "TREELFU",
		DataDir:           "/var/lib/kvtier",
		AdminAddr:         "127.0.0.1:7480",
		SocketPath:        "/run/kvtier/kvtier.sock",
		SocketMode:        "0600",
		MaxConnections:    1024,
		FrameTimeout:      30 * time.Second,
		KVEventsBlockSize: 16,
		KVEventsEncoding:  "map",
		HeartbeatInterval: time.Second,
		DiskDirectIO:      "auto",
		DiskSegmentSize:   256 * MiB,
		DiskCachePolicy:   "TREELFU",
		WriteQueueDepth:   64,
		WriteWait:         5 * time.Millisecond,
		LeaseTTL:          10 * time.Second,
		LogLevel:          "info",
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("defaults:\n got %#v\nwant %#v", c, want)
	}
	if got := c.LocalCPUBytes(); got != 5*GiB {
		t.Errorf("LocalCPUBytes = %d, want 5 GiB as LMCache counts", got)
	}
	if err := Default().Validate(); err != nil {
		t.Errorf("Default().Validate() = %v", err)
	}
}

func TestDefaultDataDir(t *testing.T) {
	env := func(kv map[string]string) func(string) string {
		return func(k string) string { return kv[k] }
	}
	cases := []struct {
		name string
		env  map[string]string
		euid int
		want string
	}{
		{"root ignores XDG", map[string]string{"XDG_STATE_HOME": "/x"}, 0, "/var/lib/kvtier"},
		{"user with XDG", map[string]string{"XDG_STATE_HOME": "/s", "HOME": "/h"}, 1000, "/s/kvtier"},
		{"user with home", map[string]string{"HOME": "/h"}, 1000, "/h/.local/state/kvtier"},
		{"relative XDG is ignored", map[string]string{"XDG_STATE_HOME": "s", "HOME": "/h"}, 1000, "/h/.local/state/kvtier"},
		{"user with nothing", nil, 1000, "/var/lib/kvtier"},
	}
	for _, tc := range cases {
		if got := defaultDataDir(env(tc.env), tc.euid); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
	c, _, err := load("", []string{"HOME=/home/u"}, 1000)
	if err != nil || c.DataDir != "/home/u/.local/state/kvtier" {
		t.Errorf("FromEnv must take HOME from environ: %q, %v", c.DataDir, err)
	}
}

func TestLMCacheExampleLoads(t *testing.T) {
	c, err := loadWith(t, "testdata/lmcache.yaml")
	if err != nil {
		t.Fatalf("LMCache example rejected: %v", err)
	}
	checks := []struct {
		key       string
		got, want any
	}{
		{"chunk_size", c.ChunkSize, 256},
		{"local_cpu", c.LocalCPU, true},
		{"max_local_cpu_size", c.MaxLocalCPUSize, 5.0},
		{"local_disk", c.LocalDisk, "/mnt/nvme/lmcache"},
		{"max_local_disk_size", c.MaxLocalDiskSize, 20.0},
		{"remote_url", c.RemoteURL, "lm://localhost:65432"},
		{"remote_serde", c.RemoteSerde, "raw"},
		{"cache_policy", c.CachePolicy, "LRU"},
		{"extra_config", c.ExtraConfig, map[string]any{
			"save_chunk_meta": false, "nested": map[string]any{"level": 2}}},
	}
	for _, ch := range checks {
		if !reflect.DeepEqual(ch.got, ch.want) {
			t.Errorf("%s = %#v, want %#v", ch.key, ch.got, ch.want)
		}
	}
	if got := c.LocalDiskBytes(); got != 20*GiB {
		t.Errorf("LocalDiskBytes = %d, want 20 GiB", got)
	}
}

func TestEnvOverridesFile(t *testing.T) {
	file := writeFile(t, "kvtier.yaml", "chunk_size: 256\nlocal_disk: /data/a\nmax_local_disk_size: 1\nlease_ttl: 1s\n")
	c, err := loadWith(t, file,
		"KVTIER_CHUNK_SIZE=512",
		"KVTIER_LOCAL_DISK=file:///data/b/",
		"KVTIER_MAX_LOCAL_DISK_SIZE=2.5",
		"KVTIER_LEASE_TTL=30s",
		"KVTIER_CHUNK_SIZE=1024", // a later duplicate loses, as with os.Getenv
	)
	if err != nil {
		t.Fatal(err)
	}
	if c.ChunkSize != 512 || c.LocalDisk != "/data/b" || c.MaxLocalDiskSize != 2.5 || c.LeaseTTL != 30*time.Second {
		t.Errorf("env did not win: %+v", c)
	}
}

func TestEnvParsesEachType(t *testing.T) {
	c, err := loadWith(t, "",
		"KVTIER_LOCAL_CPU=0",
		"KVTIER_PREFAULT=TRUE",
		"KVTIER_HUGEPAGES=1",
		"KVTIER_MAX_LOCAL_CPU_SIZE=0.5",
		"KVTIER_DISK_SEGMENT_SIZE=1.5GiB",
		"KVTIER_WRITE_WAIT=250us",
		"KVTIER_WRITE_QUEUE_DEPTH= 8 ",
		"KVTIER_CACHE_POLICY=s3fifo",
		"KVTIER_EXTRA_CONFIG={\"a\": 1, \"b\": {\"c\": \"d\"}}",
		"KVTIER_REMOTE_URL=redis://cache:6379",
		"KVTIER_NAMESPACE=tenant-7",
		"KVTIER_LOG_LEVEL=WARNING",
		"KVTIER_DISK_DIRECT_IO=Off",
	)
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.DataDir = "/var/lib/kvtier"
	want.LocalCPU, want.Prefault, want.Hugepages = false, true, true
	want.MaxLocalCPUSize = 0.5
	want.DiskSegmentSize = 1536 * MiB
	want.WriteWait = 250 * time.Microsecond
	want.WriteQueueDepth = 8
	want.CachePolicy = "S3FIFO"
	want.ExtraConfig = map[string]any{"a": 1, "b": map[string]any{"c": "d"}}
	want.RemoteURL = "redis://cache:6379"
	want.Namespace = "tenant-7"
	want.LogLevel = "warn"
	want.DiskDirectIO = "off"
	if !reflect.DeepEqual(c, want) {
		t.Errorf("got  %+v\nwant %+v", c, want)
	}
}

func TestEnvBadValuesNameTheVariable(t *testing.T) {
	cases := []struct{ env, key string }{
		{"KVTIER_CHUNK_SIZE=abc", "chunk_size"},
		{"KVTIER_LOCAL_CPU=yes", "local_cpu"},
		{"KVTIER_MAX_LOCAL_CPU_SIZE=lots", "max_local_cpu_size"},
		{"KVTIER_WRITE_WAIT=5", "write_wait"},
		{"KVTIER_DISK_SEGMENT_SIZE=12XB", "disk_segment_size"},
		{"KVTIER_EXTRA_CONFIG=[1, 2", "extra_config"},
		{"KVTIER_CHUNK_SIZE=0", "chunk_size"}, // a validation error still points at the variable
	}
	for _, tc := range cases {
		_, err := loadWith(t, "", tc.env)
		name, _, _ := strings.Cut(tc.env, "=")
		var ke *KeyError
		if !errors.As(err, &ke) || ke.Key != tc.key || ke.Source != "env "+name {
			t.Errorf("%s: got %v, want an error for key %s from env %s", tc.env, err, tc.key, name)
			continue
		}
		if !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s: message %q must name the variable and the key", tc.env, err)
		}
	}
}

func TestUnknownKeysAreRejected(t *testing.T) {
	_, err := Parse([]byte("chunk_size: 256\nchunk_sise: 512\nmystery: 1\n"), "f.yaml")
	kes := keyErrors(err)
	if len(kes) != 2 {
		t.Fatalf("want two errors, got %v", err)
	}
	if kes[0].Key != "chunk_sise" || kes[0].Source != "f.yaml:2" || !errors.Is(kes[0], ErrUnknownKey) ||
		!strings.Contains(kes[0].Error(), "did you mean chunk_size?") {
		t.Errorf("typo: %v", kes[0])
	}
	if kes[1].Key != "mystery" || kes[1].Source != "f.yaml:3" || strings.Contains(kes[1].Error(), "did you mean") {
		t.Errorf("unrelated key: %v", kes[1])
	}

	_, err = loadWith(t, "", "KVTIER_CHUNKSIZE=512", "KVTIER_CONFIG_FILE=", "PATH=/bin", "kvtier_x=1")
	var ke *KeyError
	if !errors.As(err, &ke) || ke.Key != "chunksize" || ke.Source != "env KVTIER_CHUNKSIZE" ||
		!errors.Is(err, ErrUnknownKey) || !strings.Contains(err.Error(), "did you mean chunk_size?") {
		t.Errorf("env: got %v", err)
	}
	if n := len(keyErrors(err)); n != 1 {
		t.Errorf("only KVTIER_CHUNKSIZE is wrong, got %d errors: %v", n, err)
	}
}

func TestDuplicateKeysAreRejected(t *testing.T) {
	cases := []struct{ doc, key, source string }{
		{"chunk_size: 256\nlocal_cpu: true\nchunk_size: 512\n", "chunk_size", "f.yaml:3"},
		{"hugepages: true\nlocal_cpu_use_hugepages: false\n", "local_cpu_use_hugepages", "f.yaml:2"},
		{"enable_pd: false\nenable_pd: false\n", "enable_pd", "f.yaml:2"},
	}
	for _, tc := range cases {
		_, err := Parse([]byte(tc.doc), "f.yaml")
		var ke *KeyError
		if !errors.As(err, &ke) || ke.Key != tc.key || ke.Source != tc.source || !errors.Is(err, ErrDuplicateKey) {
			t.Errorf("%q: got %v", tc.doc, err)
		}
	}
	_, err := loadWith(t, "", "KVTIER_HUGEPAGES=1", "KVTIER_LOCAL_CPU_USE_HUGEPAGES=1")
	if !errors.Is(err, ErrDuplicateKey) || !strings.Contains(err.Error(), "KVTIER_HUGEPAGES") {
		t.Errorf("env synonyms: got %v", err)
	}
}

func TestSynonym(t *testing.T) {
	c, err := Parse([]byte("local_cpu_use_hugepages: true\n"), "f.yaml")
	if err != nil || !c.Hugepages {
		t.Errorf("local_cpu_use_hugepages did not set hugepages: %v, %v", c.Hugepages, err)
	}
}

func TestFileNullAndEmptyKeepDefaults(t *testing.T) {
	for _, doc := range []string{"", "~\n", "# only a comment\n", "chunk_size:\nremote_url: null\nlocal_disk: ~\n"} {
		c, err := Parse([]byte(doc), "f.yaml")
		if err != nil || c.ChunkSize != 256 || c.RemoteURL != "" || c.LocalDisk != "" {
			t.Errorf("%q: got %+v, %v", doc, c, err)
		}
	}
}

func TestFileShapeErrors(t *testing.T) {
	cases := map[string]string{
		"- a\n- b\n":                  "want a mapping of keys to values",
		"chunk_size: 1\n---\nx: 1\n":  "single YAML document",
		"chunk_size: [1\n":            "f.yaml: yaml:",
		"? [a]\n: 1\n":                "want a key name",
		"chunk_size: 1.5\n":           `want an integer, got "1.5"`,
		"chunk_size: \"256\"\n":       `want an integer, got "256"`,
		"local_cpu: maybe\n":          "want true or false",
		"max_local_cpu_size: many\n":  "want a number",
		"remote_url: {a: 1}\n":        "want a string, got a mapping",
		"write_wait: 5\n":             "missing unit",
		"disk_segment_size: 1.1B\n":   "whole number of bytes",
		"extra_config: [1]\n":         "want a mapping, got a list",
		"lease_ttl: [1s]\n":           "want a duration",
		"disk_segment_size: [1]\n":    "want a byte count",
		"local_disk: file://cache/\n": "want an absolute path",
	}
	for doc, want := range cases {
		_, err := Parse([]byte(doc), "f.yaml")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want it to contain %q", doc, err, want)
		}
	}
}

func TestAliasesInFile(t *testing.T) {
	c, err := Parse([]byte("extra_config: &x {a: 1}\nnamespace: &ns team\n"), "f.yaml")
	if err != nil || c.Namespace != "team" {
		t.Fatalf("anchors: %+v %v", c, err)
	}
	// An alias used as a value resolves to its anchor.
	doc := "extra_config: {size: &s 4096}\nwrite_queue_depth: *s\n"
	c, err = Parse([]byte(doc), "f.yaml")
	if err != nil || c.WriteQueueDepth != 4096 {
		t.Errorf("alias value: %+v %v", c.WriteQueueDepth, err)
	}
}

func TestConfigFileFromEnvironment(t *testing.T) {
	kv := writeFile(t, "kvtier.yaml", "chunk_size: 128\n")
	lm := writeFile(t, "lmcache.yaml", "chunk_size: 64\n")
	cases := []struct {
		env  []string
		want int
	}{
		{[]string{"LMCACHE_CONFIG_FILE=" + lm}, 64},
		{[]string{"LMCACHE_CONFIG_FILE=" + lm, "KVTIER_CONFIG_FILE=" + kv}, 128},
		{[]string{"KVTIER_CONFIG_FILE=", "LMCACHE_CONFIG_FILE=" + lm}, 64},
	}
	for _, tc := range cases {
		c, err := FromEnv(tc.env)
		if err != nil || c.ChunkSize != tc.want {
			t.Errorf("%v: chunk_size %d, %v; want %d", tc.env, c.ChunkSize, err, tc.want)
		}
	}
	// An explicit path beats both.
	c, _, err := load(kv, []string{"LMCACHE_CONFIG_FILE=" + lm}, 0)
	if err != nil || c.ChunkSize != 128 {
		t.Errorf("explicit path: %d, %v", c.ChunkSize, err)
	}
	_, err = FromEnv([]string{"KVTIER_CONFIG_FILE=/nonexistent/kvtier.yaml"})
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "named by KVTIER_CONFIG_FILE") {
		t.Errorf("missing file: got %v", err)
	}
}

func TestLoadUsesProcessEnvironment(t *testing.T) {
	path := writeFile(t, "kvtier.yaml", "chunk_size: 128\n")
	t.Setenv("KVTIER_WRITE_QUEUE_DEPTH", "7")
	c, err := Load(path)
	if err != nil || c.ChunkSize != 128 || c.WriteQueueDepth != 7 {
		t.Errorf("Load: %+v, %v", c, err)
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	c := Default()
	c.ChunkSize = 512
	c.LocalDisk = "/var/cache/kvtier"
	c.MaxLocalDiskSize = 100
	c.RemoteURL = "s3://bucket/prefix"
	c.RemoteSerde = "zstd"
	c.CachePolicy = "ARC"
	c.DiskSegmentSize = 8 * GB
	c.WriteWait = 0
	c.Namespace = "tenant"
	c.ExtraConfig = map[string]any{"k": []any{1, "two"}}
	out, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(out, "marshalled")
	if err != nil {
		t.Fatalf("marshalled config does not load: %v\n%s", err, out)
	}
	if !reflect.DeepEqual(back, c) {
		t.Errorf("round trip changed the config:\n got %+v\nwant %+v\n%s", back, c, out)
	}
	if !strings.Contains(string(out), "disk_segment_size: 8GB\n") || !strings.Contains(string(out), "write_wait: 0s\n") {
		t.Errorf("sizes and durations should marshal readably:\n%s", out)
	}
}

func TestUnmarshalYAMLIsStrict(t *testing.T) {
	var outer struct {
		Cache Config `yaml:"cache"`
	}
	outer.Cache = Default()
	err := yaml.Unmarshal([]byte("cache:\n  chunk_size: 64\n  bogus: 1\n"), &outer)
	var ke *KeyError
	if !errors.As(err, &ke) || ke.Key != "bogus" || ke.Source != "line 3" {
		t.Errorf("embedded unknown key: %v", err)
	}
	if err := yaml.Unmarshal([]byte("cache:\n  chunk_size: 64\n"), &outer); err != nil || outer.Cache.ChunkSize != 64 {
		t.Errorf("embedded: %v %d", err, outer.Cache.ChunkSize)
	}
}

func TestStringIsRedactedYAML(t *testing.T) {
	c := Default()
	c.RemoteURL = "redis://app:hunter2@cache:6379/0"
	s := c.String()
	if strings.Contains(s, "hunter2") {
		t.Errorf("String leaks the password:\n%s", s)
	}
	if !strings.Contains(s, "remote_url: redis://app:REDACTED@cache:6379/0\n") || !strings.Contains(s, "chunk_size: 256\n") {
		t.Errorf("String is not the effective config:\n%s", s)
	}
	if c.RemoteURL != "redis://app:hunter2@cache:6379/0" {
		t.Errorf("String modified the config")
	}
}

func TestKeysAndEnvName(t *testing.T) {
	keys := Keys()
	if keys[0] != "chunk_size" || keys[len(keys)-1] != "extra_config" || len(keys) != reflect.TypeFor[Config]().NumField() {
		t.Errorf("Keys() = %v", keys)
	}
	if got := EnvName("max_local_cpu_size"); got != "KVTIER_MAX_LOCAL_CPU_SIZE" {
		t.Errorf("EnvName = %q", got)
	}
	if got := LMCacheEnvName("py_enable_gc"); got != "LMCACHE_PY_ENABLE_GC" {
		t.Errorf("LMCacheEnvName = %q", got)
	}
}

// LMCache's parser (PyYAML) reads YAML 1.1 booleans; so must kvtier.
func TestYAML11Booleans(t *testing.T) {
	c, err := Parse([]byte("local_cpu: off\nmax_local_cpu_size: 0\nprefault: yes\nhugepages: On\n"), "f.yaml")
	if err != nil || c.LocalCPU || !c.Prefault || !c.Hugepages {
		t.Errorf("got local_cpu=%v prefault=%v hugepages=%v, %v", c.LocalCPU, c.Prefault, c.Hugepages, err)
	}
}

func TestP2PPeersAsListOrString(t *testing.T) {
	for _, text := range []string{
		"p2p_peers: [10.0.0.2:7482, 10.0.0.3:7482]\n",
		"p2p_peers:\n  - 10.0.0.2:7482\n  - 10.0.0.3:7482\n",
		"p2p_peers: 10.0.0.2:7482, 10.0.0.3:7482\n",
	} {
		c, err := Parse([]byte(text), "test.yaml")
		if err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		if want := []string{"10.0.0.2:7482", "10.0.0.3:7482"}; !slices.Equal(c.P2PPeers, want) {
			t.Errorf("%q: p2p_peers = %q, want %q", text, c.P2PPeers, want)
		}
	}
	c, err := loadWith(t, "", "KVTIER_P2P_PEERS=10.0.0.2:7482 10.0.0.3:7482")
	if err != nil || len(c.P2PPeers) != 2 {
		t.Fatalf("from the environment: %q, %v", c.P2PPeers, err)
	}
	if _, err := Parse([]byte("p2p_peers: {a: b}\n"), "test.yaml"); err == nil || !strings.Contains(err.Error(), "a list of strings") {
		t.Errorf("a mapping for p2p_peers: %v", err)
	}
}

func TestLMCacheEnableP2P(t *testing.T) {
	_, err := Parse([]byte("chunk_size: 256\nenable_p2p: true\np2p_host: 10.0.0.1\np2p_init_ports: [8200]\n"), "lmcache.yaml")
	if err == nil || !strings.Contains(err.Error(), "enable_p2p") || !strings.Contains(err.Error(), "p2p_peers") {
		t.Fatalf("enable_p2p without peers: %v", err)
	}
	c, err := Parse([]byte("chunk_size: 256\nenable_p2p: true\np2p_host: 10.0.0.1\np2p_init_ports: [8200]\np2p_peers: [10.0.0.2:7482]\n"), "lmcache.yaml")
	if err != nil || !c.EnableP2P || len(c.P2PPeers) != 1 {
		t.Fatalf("enable_p2p with peers: %+v, %v", c.P2PPeers, err)
	}
}
