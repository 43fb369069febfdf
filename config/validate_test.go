package config

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestEveryValidationErrorNamesItsKey(t *testing.T) {
	cases := []struct {
		key    string
		mutate func(*Config)
		says   string
	}{
		{"chunk_size", func(c *Config) { c.ChunkSize = 0 }, "want 1 to"},
		{"chunk_size", func(c *Config) { c.ChunkSize = 1<<20 + 1 }, "want 1 to"},
		{"max_local_cpu_size", func(c *Config) { c.MaxLocalCPUSize = 0 }, "when local_cpu is true"},
		{"max_local_cpu_size", func(c *Config) { c.MaxLocalCPUSize = -1 }, "want 0 to"},
		{"max_local_cpu_size", func(c *Config) { c.MaxLocalCPUSize = math.NaN() }, "want 0 to"},
		{"max_local_cpu_size", func(c *Config) { c.LocalCPU = false; c.MaxLocalCPUSize = math.Inf(1) }, "want 0 to"},
		{"local_disk", func(c *Config) { c.LocalDisk = "s3://bucket"; c.MaxLocalDiskSize = 1 }, `scheme "s3"`},
		{"local_disk", func(c *Config) { c.LocalDisk = "relative/dir"; c.MaxLocalDiskSize = 1 }, "absolute path"},
		{"max_local_disk_size", func(c *Config) { c.LocalDisk = "/data" }, "when local_disk is set"},
		{"max_local_disk_size", func(c *Config) { c.MaxLocalDiskSize = -0.5 }, "want 0 to"},
		{"remote_url", func(c *Config) { c.RemoteURL = "localhost:6379" }, "scheme://host"},
		{"remote_url", func(c *Config) { c.RemoteURL = "/just/a/path" }, "with a scheme"},
		{"remote_url", func(c *Config) { c.RemoteURL = "redis://" }, "scheme://host"},
		{"remote_url", func(c *Config) { c.RemoteURL = "redis://h:port" }, "invalid port"},
		{"remote_serde", func(c *Config) { c.RemoteSerde = "pickle" }, "want one of raw, naive, zstd, lz4, fp8, int8"},
		{"remote_serde", func(c *Config) { c.RemoteSerde = "cachegen" }, "does not support yet"},
		{"cache_policy", func(c *Config) { c.CachePolicy = "random" }, "want one of LRU, LFU, FIFO, MRU, S3FIFO, ARC"},
		{"data_dir", func(c *Config) { c.DataDir = "state" }, "absolute path"},
		{"admin_addr", func(c *Config) { c.AdminAddr = "" }, "want host:port"},
		{"admin_addr", func(c *Config) { c.AdminAddr = "localhost" }, "want host:port"},
		{"admin_addr", func(c *Config) { c.AdminAddr = "127.0.0.1:http" }, "want a port number"},
		{"admin_addr", func(c *Config) { c.AdminAddr = "127.0.0.1:65536" }, "want a port number"},
		{"admin_addr", func(c *Config) { c.AdminAddr = "127.0.0.1:" }, "want a port number"},
		{"disk_direct_io", func(c *Config) { c.DiskDirectIO = "true" }, "want one of auto, on, off"},
		{"disk_segment_size", func(c *Config) { c.DiskSegmentSize = 512 * KiB }, "at least 1MiB"},
		{"disk_segment_size", func(c *Config) { c.DiskSegmentSize = MiB + 512 }, "multiple of 4KiB"},
		{"disk_cache_policy", func(c *Config) { c.DiskCachePolicy = "random" }, "want one of LRU, LFU, FIFO, MRU, S3FIFO, ARC"},
		{"write_queue_depth", func(c *Config) { c.WriteQueueDepth = 0 }, "want 1 to"},
		{"write_wait", func(c *Config) { c.WriteWait = -time.Millisecond }, "want 0 or more"},
		{"lease_ttl", func(c *Config) { c.LeaseTTL = 0 }, "want more than 0"},
		{"log_level", func(c *Config) { c.LogLevel = "trace" }, "want one of debug, info, warn, error"},
		{"kv_events_encoding", func(c *Config) { c.KVEventsEncoding = "json" }, "want map or array"},
		{"p2p_peers", func(c *Config) { c.P2PPeers = []string{"peer-host"} }, "want host:port"},
		{"p2p_peers", func(c *Config) { c.P2PPeers = []string{"10.0.0.2:0"} }, "real port"},
		{"p2p_peers", func(c *Config) { c.TCPAddr = "10.0.0.1:7482"; c.P2PPeers = []string{"10.0.0.1:7482"} }, "own tcp_addr"},
		{"enable_p2p", func(c *Config) { c.EnableP2P = true }, "controller_url"},
		{"heartbeat_interval", func(c *Config) { c.HeartbeatInterval = 0 }, "want more than 0"},
		{"instance_id", func(c *Config) { c.InstanceID = "a@b" }, "without spaces or '@'"},
		{"controller_url", func(c *Config) { joinCluster(c); c.ControllerURL = "ftp://c:1" }, "http://host:port"},
		{"cluster_events_endpoint", func(c *Config) { joinCluster(c); c.ClusterEventsEndpoint = "" }, "required with controller_url"},
		{"tcp_addr", func(c *Config) { joinCluster(c); c.TCPAddr = "" }, "peers pull chunks"},
	}
	for _, tc := range cases {
		c := Default()
		tc.mutate(&c)
		err := c.Validate()
		kes := keyErrors(err)
		if len(kes) != 1 || kes[0].Key != tc.key {
			t.Errorf("%s (%s): want exactly one error for the key, got %v", tc.key, tc.says, err)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "key "+tc.key+":") || !strings.Contains(msg, tc.says) {
			t.Errorf("%s: message %q should name the key and say %q", tc.key, msg, tc.says)
		}
	}
}

func TestValidateReportsEveryError(t *testing.T) {
	c := Default()
	c.ChunkSize, c.CachePolicy, c.LeaseTTL = -1, "nope", -time.Second
	var keys []string
	for _, ke := range keyErrors(c.Validate()) {
		keys = append(keys, ke.Key)
	}
	if strings.Join(keys, ",") != "chunk_size,cache_policy,lease_ttl" {
		t.Errorf("got errors for %v", keys)
	}
}

func TestValidationErrorsPointAtTheFileLine(t *testing.T) {
	doc := "# kvtier\nlocal_disk: /data\ncache_policy: MRU\nchunk_size: 0\n"
	_, err := Parse([]byte(doc), "kvtier.yaml")
	kes := keyErrors(err)
	if len(kes) != 2 {
		t.Fatalf("want 2 errors, got %v", err)
	}
	if kes[0].Key != "chunk_size" || kes[0].Source != "kvtier.yaml:4" {
		t.Errorf("chunk_size error: %v", kes[0])
	}
	// max_local_disk_size was never written: no place to point at, but the
	// message still says which key to add.
	if kes[1].Key != "max_local_disk_size" || kes[1].Source != "" {
		t.Errorf("max_local_disk_size error: %v", kes[1])
	}
}

func TestNormalisation(t *testing.T) {
	c := Default()
	c.CachePolicy, c.RemoteSerde, c.DiskDirectIO, c.LogLevel = " lfu", "NAIVE", "ON", "Warning"
	c.LocalDisk, c.MaxLocalDiskSize = "file:///data//kv/./cache/", 1
	if err := c.Validate(); err != nil {
		t.Fatalf("accepted spellings rejected: %v", err)
	}
	if c.CachePolicy != " lfu" {
		t.Errorf("Validate must not modify its receiver")
	}
	out, err := Parse([]byte("cache_policy: lfu\nremote_serde: NAIVE\ndisk_direct_io: ON\nlog_level: Warning\n"+
		"local_disk: file:///data//kv/./cache/\nmax_local_disk_size: 1\n"), "f")
	if err != nil {
		t.Fatal(err)
	}
	if out.CachePolicy != "LFU" || out.RemoteSerde != "raw" || out.DiskDirectIO != "on" ||
		out.LogLevel != "warn" || out.LocalDisk != "/data/kv/cache" {
		t.Errorf("not normalised: %+v", out)
	}
}

func TestRemoteURLSchemesAreNotJudgedHere(t *testing.T) {
	for _, u := range []string{"redis://h:6379", "rediss://u:p@h:6380/1", "s3://bucket/prefix", "fs:///mnt/share",
		"lm://localhost:65432", "kvtier://peer:7070", "valkey+cluster://a:1,b:2", "whatever-scheme://x"} {
		c := Default()
		c.RemoteURL = u
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
}

func TestURLErrorsDoNotLeakPasswords(t *testing.T) {
	for _, u := range []string{"redis://app:hunter2@h:port", "redis://app:hunter2@", "app:hunter2@h"} {
		c := Default()
		c.RemoteURL = u
		err := c.Validate()
		if err == nil {
			t.Errorf("%s: want an error", u)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: error leaks the password: %v", u, err)
		}
		var ke *KeyError
		if !errors.As(err, &ke) || ke.Key != "remote_url" {
			t.Errorf("%s: %v", u, err)
		}
	}
}

func TestAdminAddrAcceptsListenAddresses(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:7480", ":7480", "[::1]:0", "localhost:65535", "0.0.0.0:0"} {
		c := Default()
		c.AdminAddr = addr
		if err := c.Validate(); err != nil {
			t.Errorf("admin_addr %q refused: %v", addr, err)
		}
	}
}

// joinCluster sets the keys a daemon needs to join a controller.
func joinCluster(c *Config) {
	c.ControllerURL, c.ClusterEventsEndpoint, c.TCPAddr = "http://c:7481", "tcp://*:7483", "127.0.0.1:7482"
}

func TestValidateClusterKeys(t *testing.T) {
	c := Default()
	joinCluster(&c)
	if err := c.Validate(); err != nil {
		t.Fatalf("a daemon joining a controller: %v", err)
	}
	// The controller finds P2P peers: enable_p2p needs no p2p_peers then.
	c.EnableP2P = true
	if err := c.Validate(); err != nil {
		t.Fatalf("enable_p2p with controller_url and no p2p_peers: %v", err)
	}
	for raw, want := range map[string]string{"http://c:7481/": "http://c:7481", "c:7481": "http://c:7481", "https://c": "https://c"} {
		c.ControllerURL = raw
		if got, err := c.ControllerBase(); err != nil || got != want {
			t.Errorf("ControllerBase(%q) = %q, %v; want %q", raw, got, err, want)
		}
	}
	// Several controller replicas, asked in turn.
	c.ControllerURL = "http://a:7481/, b:7481,https://c"
	got, err := c.ControllerBases()
	if err != nil || strings.Join(got, " ") != "http://a:7481 http://b:7481 https://c" {
		t.Errorf("ControllerBases(%q) = %q, %v", c.ControllerURL, got, err)
	}
	for _, bad := range []string{"http://a:7481,", "http://a:7481,ftp://b", ",http://a"} {
		c.ControllerURL = bad
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "controller_url") {
			t.Errorf("controller_url %q: %v, want an error naming controller_url", bad, err)
		}
	}
}
