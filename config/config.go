// Package config holds kvtier's configuration: a YAML file overlaid with
// LMCACHE_<KEY> and then KVTIER_<KEY> environment variables.
//
// Key names follow LMCache's wherever the meaning is the same, and every
// key of LMCache's configuration is recognised, so an LMCache user can hand
// kvtier the file and environment they already have (LMCACHE_CONFIG_FILE
// is honoured too). lmcache.go lists LMCache's keys and what kvtier does
// with each: implements it, maps it onto a kvtier key, ignores it (a value
// other than LMCache's default is logged once as a warning), or refuses it
// (any value but the default is an error) — the last for features kvtier
// lacks and settings without which it would silently cache or return
// something else: a file that relies on layerwise pipelining or GDS
// fails loudly instead of silently losing the feature.
//
// Loading is strict, because a typo in a cache configuration does not crash
// anything — it just quietly makes the cache smaller, slower or absent.
// Unknown keys, keys given twice, values of the wrong type, bad values and
// KVTIER_ variables that match no key are all errors, reported together.
// Each is a *KeyError naming the key and where its value came from
// (file:line or the variable); only unreadable files and malformed YAML
// produce other errors. LMCACHE_ variables that name no LMCache key are
// left alone, since LMCache uses the prefix for other settings too.
//
// The flow is: defaults → file → LMCACHE_ variables → KVTIER_ variables →
// normalise → validate. A null value in the file means "keep the default".
package config

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"kvtier/codec"
	"kvtier/tier/policy"
)

// Config is the effective configuration. Field order is the order of
// String() and of docs/configuration.md.
type Config struct {
	// ChunkSize is the number of tokens per chunk (LMCache chunk_size).
	ChunkSize int `yaml:"chunk_size"`

	// LocalCPU enables the RAM tier; MaxLocalCPUSize is its size in GB as
	// LMCache counts them (GiB, 1<<30 bytes). See LocalCPUBytes.
	LocalCPU        bool    `yaml:"local_cpu"`
	MaxLocalCPUSize float64 `yaml:"max_local_cpu_size"`

	// LocalDisk is the directory of the disk tier, "" when disabled. The file
	// may write it as LMCache does ("file:///path"); after loading it is a
	// clean absolute path. MaxLocalDiskSize is in GiB like MaxLocalCPUSize.
	LocalDisk        string  `yaml:"local_disk"`
	MaxLocalDiskSize float64 `yaml:"max_local_disk_size"`

	// RemoteURL selects the remote tier by scheme, "" when disabled;
	// several URLs separated by spaces stack several remote tiers, in
	// order. RemoteSerde is the chunk encoding used there (LMCache's
	// "naive" is loaded as "raw"); RemoteTimeout bounds each remote call.
	RemoteURL     string        `yaml:"remote_url"`
	RemoteSerde   string        `yaml:"remote_serde"`
	RemoteTimeout time.Duration `yaml:"remote_timeout"`

	// CachePolicy names the eviction policy, in upper case after loading.
	CachePolicy string `yaml:"cache_policy"`

	// SaveUnfullChunk stores a prompt's last, partial chunk too;
	// SaveDecodeCache stores KV produced while decoding, not only prefill.
	SaveUnfullChunk bool `yaml:"save_unfull_chunk"`
	SaveDecodeCache bool `yaml:"save_decode_cache"`

	// Namespace is mixed into every chunk key, so tenants never share KV.
	Namespace string `yaml:"namespace"`

	// DataDir is where the daemon keeps state that is not cache content.
	DataDir string `yaml:"data_dir"`

	// AdminAddr is the host:port of the daemon's HTTP admin server (health,
	// metrics, JSON API). Port 0 picks a free port, which the daemon logs.
	AdminAddr string `yaml:"admin_addr"`
	// AdminToken is the admin API's bearer token, required to listen
	// beyond loopback; with one, every mutation needs it, and the reads
	// too unless AdminReadOpen. AdminTLSCert and AdminTLSKey, both or
	// neither, serve the admin API over TLS (docs/security.md).
	AdminToken    string `yaml:"admin_token"`
	AdminReadOpen bool   `yaml:"admin_read_open"`
	AdminTLSCert  string `yaml:"admin_tls_cert"`
	AdminTLSKey   string `yaml:"admin_tls_key"`

	// SocketPath is the Unix socket of the local protocol, through which
	// connectors on this host share the RAM arena. SocketMode is its file
	// mode, the local protocol's only access control.
	SocketPath string `yaml:"socket_path"`
	SocketMode string `yaml:"socket_mode"`
	// TCPAddr is the host:port of the TCP protocol (remote clients and
	// other daemons); empty disables it. TCPToken is its shared secret,
	// required beyond loopback. TCPTLSCert and TCPTLSKey, both or neither,
	// turn on TLS.
	TCPAddr    string `yaml:"tcp_addr"`
	TCPToken   string `yaml:"tcp_token"`
	TCPTLSCert string `yaml:"tcp_tls_cert"`
	TCPTLSKey  string `yaml:"tcp_tls_key"`
	// TCPTLSCA is a PEM file of the certificate authorities this daemon
	// trusts when it dials another daemon's TCP protocol (PD pushes):
	// with it set, those connections run over TLS.
	TCPTLSCA string `yaml:"tcp_tls_ca"`
	// P2PPeers are other daemons' TCP addresses (host:port): a P2P tier
	// reads chunks from their RAM and disk on a local miss, before the
	// remote tiers. The daemon presents its own tcp_token to them: a
	// fleet shares one secret. The tier is on whenever peers are given.
	// EnableP2P with controller_url and no peers makes the tier find
	// holders through the controller's cluster lookup instead; with
	// neither it is an error. Given peers win over the controller.
	P2PPeers  []string `yaml:"p2p_peers"`
	EnableP2P bool     `yaml:"enable_p2p"`
	// MaxConnections caps the cache protocol's open connections, local and
	// TCP together; FrameTimeout is how long a frame may take to arrive
	// once its header has; HandshakeTimeout how long a new connection may
	// take to send HELLO. Together they bound what clients that connect
	// and stall can make the daemon hold.
	MaxConnections   int           `yaml:"max_connections"`
	FrameTimeout     time.Duration `yaml:"frame_timeout"`
	HandshakeTimeout time.Duration `yaml:"handshake_timeout"`
	// PDReceiveBytes bounds the bytes of chunks other daemons push here
	// (prefill/decode transfer) held for their readers at once; 0 means
	// 1 GiB or half the RAM tier, whichever is less.
	PDReceiveBytes Size `yaml:"pd_receive_bytes"`
	// PDPushAllow lists where this daemon may push chunks when a client
	// asks (host:port, host or CIDR entries, see package netallow); empty
	// allows loopback addresses only. The push presents tcp_token there.
	PDPushAllow []string `yaml:"pd_push_allow"`
	// Tenants bind tokens to namespaces: a connection or admin request
	// presenting a tenant's token reaches the scopes of its namespaces
	// only (docs/security.md#tenants; tenants.go).
	Tenants []Tenant `yaml:"tenants"`

	// KVEventsEndpoint, when set, is the ZMQ address where the daemon
	// publishes vLLM-format KV events for the chunks its RAM and disk
	// tiers hold, so a kvtier router scores the pod for them. The events
	// name the pod KVEventsPod serving KVEventsModel and carry vLLM block
	// hashes computed with the pod's PYTHONHASHSEED (KVEventsHashSeed) and
	// block size (KVEventsBlockSize).
	KVEventsEndpoint  string `yaml:"kv_events_endpoint"`
	KVEventsPod       string `yaml:"kv_events_pod"`
	KVEventsModel     string `yaml:"kv_events_model"`
	KVEventsHashSeed  string `yaml:"kv_events_hash_seed"`
	KVEventsBlockSize int    `yaml:"kv_events_block_size"`
	// KVEventsEncoding is how each event is laid out: "map" (vLLM since
	// 0.26, llm-d since v0.9) or "array" (the older tagged arrays).
	KVEventsEncoding string `yaml:"kv_events_encoding"`

	// ControllerURL, when set, makes the daemon a member of the cluster
	// run by the kvtier controller at this URL: it registers as
	// InstanceID (by default the host name and the TCP port), beats every
	// HeartbeatInterval, and reports the chunks of its RAM and disk tiers
	// on ClusterEventsEndpoint (docs/cluster.md). It needs tcp_addr: peers
	// pull chunks over the TCP protocol.
	ControllerURL         string        `yaml:"controller_url"`
	InstanceID            string        `yaml:"instance_id"`
	ClusterEventsEndpoint string        `yaml:"cluster_events_endpoint"`
	HeartbeatInterval     time.Duration `yaml:"heartbeat_interval"`
	// ControllerToken is presented to the controller (Authorization:
	// Bearer) by the daemon's registration, beats and P2P lookups: the
	// controller's cluster_token.
	ControllerToken string `yaml:"controller_token"`

	// DiskDirectIO is auto, on or off: whether the disk tier bypasses the
	// page cache with O_DIRECT. auto uses it where the filesystem allows.
	DiskDirectIO string `yaml:"disk_direct_io"`
	// DiskSegmentSize is the size of one log segment of the disk tier.
	DiskSegmentSize Size `yaml:"disk_segment_size"`
	// DiskCachePolicy names the disk tier's eviction policy, in upper case
	// after loading; cache_policy is the RAM tier's.
	DiskCachePolicy string `yaml:"disk_cache_policy"`

	// WriteQueueDepth bounds the writes queued for each tier below RAM.
	WriteQueueDepth int `yaml:"write_queue_depth"`
	// WriteWait is the longest one store blocks, in all, on full lower-tier
	// queues before writes to those tiers are dropped. Zero never blocks.
	WriteWait time.Duration `yaml:"write_wait"`
	// LeaseTTL is how long a pin protects a chunk from eviction unless renewed.
	LeaseTTL time.Duration `yaml:"lease_ttl"`

	// Hugepages backs the RAM arena with huge pages (LMCache's
	// local_cpu_use_hugepages is accepted as a synonym); Prefault touches
	// every page at start so the first requests do not pay for page faults.
	Hugepages bool `yaml:"hugepages"`
	Prefault  bool `yaml:"prefault"`

	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"log_level"`

	// ExtraConfig is LMCache's free-form extra_config, kept as read.
	ExtraConfig map[string]any `yaml:"extra_config,omitempty"`
}

// Enumerated values, in the order error messages list them. Policies and
// encodings are asked of the packages that build them, so a new one is
// accepted here without a second list to keep in step; "naive" is
// LMCache's name for raw.
var (
	cachePolicies = policy.Names()
	remoteSerdes  = slices.Insert(codec.Names(), 1, "naive")
	directIOModes = []string{"auto", "on", "off"}
	logLevels     = []string{"debug", "info", "warn", "error"}
)

// Default returns the built-in defaults. DataDir depends on the user, see
// docs/configuration.md.
func Default() Config { return defaults(os.Getenv, os.Geteuid()) }

func defaults(getenv func(string) string, euid int) Config {
	return Config{
		ChunkSize:         256,
		LocalCPU:          true,
		MaxLocalCPUSize:   5.0,
		MaxLocalDiskSize:  0,
		RemoteSerde:       "raw",
		RemoteTimeout:     100 * time.Millisecond, // a round trip; transfers get more (remote.CallDeadline)
		CachePolicy:       policy.Default,
		DataDir:           defaultDataDir(getenv, euid),
		AdminAddr:         "127.0.0.1:7480",
		SocketPath:        defaultSocketPath(getenv, euid),
		SocketMode:        "0600",
		MaxConnections:    1024,
		FrameTimeout:      30 * time.Second,
		HandshakeTimeout:  10 * time.Second,
		KVEventsBlockSize: 16,
		KVEventsEncoding:  "map",
		HeartbeatInterval: time.Second,
		DiskDirectIO:      "auto",
		DiskSegmentSize:   256 * MiB,
		DiskCachePolicy:   policy.Default,
		WriteQueueDepth:   64,
		WriteWait:         5 * time.Millisecond,
		LeaseTTL:          10 * time.Second,
		LogLevel:          "info",
	}
}

// RemoteURLs returns the remote tiers' URLs, in order.
func (c Config) RemoteURLs() []string { return strings.Fields(c.RemoteURL) }

// defaultSocketPath is /run/kvtier/kvtier.sock for root, else
// kvtier.sock in $XDG_RUNTIME_DIR, else /tmp/kvtier-<uid>.sock.
func defaultSocketPath(getenv func(string) string, euid int) string {
	if euid == 0 {
		return "/run/kvtier/kvtier.sock"
	}
	if dir := getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(dir) {
		return filepath.Join(dir, "kvtier.sock")
	}
	return fmt.Sprintf("/tmp/kvtier-%d.sock", euid)
}

// defaultDataDir is /var/lib/kvtier for root (a system daemon) and the XDG
// state directory for anyone else, who could not write to /var/lib.
func defaultDataDir(getenv func(string) string, euid int) string {
	const system = "/var/lib/kvtier"
	if euid == 0 {
		return system
	}
	if d := getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "kvtier")
	}
	if h := getenv("HOME"); filepath.IsAbs(h) {
		return filepath.Join(h, ".local", "state", "kvtier")
	}
	return system
}

// LocalCPUBytes is MaxLocalCPUSize in bytes, truncated as LMCache does.
func (c Config) LocalCPUBytes() Size { return gibToBytes(c.MaxLocalCPUSize) }

// LocalDiskBytes is MaxLocalDiskSize in bytes, truncated as LMCache does.
func (c Config) LocalDiskBytes() Size { return gibToBytes(c.MaxLocalDiskSize) }

func gibToBytes(gib float64) Size { return Size(gib * float64(GiB)) }

// String returns the effective configuration as YAML with secrets hidden,
// so that logging a Config never leaks a password.
func (c Config) String() string {
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	err := enc.Encode(c.Redacted())
	if err == nil {
		err = enc.Close()
	}
	if err != nil {
		// Only a value put into ExtraConfig by hand can fail to encode.
		return fmt.Sprintf("config: cannot render: %v", err)
	}
	return b.String()
}
