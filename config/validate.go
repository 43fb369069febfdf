package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"kvtier/netallow"
)

// Bounds that no sensible configuration comes near; they exist so that a
// stray digit fails at load time rather than in an allocation.
const (
	maxChunkSize       = 1 << 20
	maxGiB             = 1 << 20 // 1 PiB of RAM or disk
	maxWriteQueueDepth = 1 << 20
	maxConnections     = 1 << 20
	minSegmentSize     = MiB
	segmentAlign       = 4 * KiB // O_DIRECT needs block-aligned segments
)

// Validate reports every invalid value, each as a *KeyError joined with
// errors.Join. It checks a normalised copy, so spellings Load would accept
// ("lru", "file:///x") are valid here too.
func (c Config) Validate() error {
	var errs []error
	if err := c.normalize(); err != nil {
		errs = append(errs, err)
	}
	bad := func(key, format string, args ...any) {
		errs = append(errs, &KeyError{Key: key, Err: fmt.Errorf(format, args...)})
	}

	c.validateTenants(bad)
	if c.ChunkSize < 1 || c.ChunkSize > maxChunkSize {
		bad("chunk_size", "want 1 to %d tokens, got %d", maxChunkSize, c.ChunkSize)
	}
	if err := checkGiB(c.MaxLocalCPUSize, c.LocalCPU, "local_cpu is true"); err != nil {
		bad("max_local_cpu_size", "%w", err)
	}
	if err := checkGiB(c.MaxLocalDiskSize, c.LocalDisk != "", "local_disk is set"); err != nil {
		bad("max_local_disk_size", "%w", err)
	}
	for _, u := range c.RemoteURLs() {
		if err := checkURL(u); err != nil {
			bad("remote_url", "%w", err)
		}
	}
	if c.RemoteTimeout <= 0 {
		bad("remote_timeout", "want a positive duration, got %v", c.RemoteTimeout)
	}
	switch {
	case c.RemoteSerde == "cachegen":
		bad("remote_serde", "%q %w", c.RemoteSerde, ErrUnsupported)
	case !slices.Contains(remoteSerdes, c.RemoteSerde):
		bad("remote_serde", "%w", oneOf(c.RemoteSerde, remoteSerdes))
	}
	if !slices.Contains(cachePolicies, c.CachePolicy) {
		bad("cache_policy", "%w", oneOf(c.CachePolicy, cachePolicies))
	}
	if !filepath.IsAbs(c.DataDir) {
		bad("data_dir", "want an absolute path, got %q", c.DataDir)
	}
	if err := checkHostPort(c.AdminAddr); err != nil {
		bad("admin_addr", "%w", err)
	}
	if !filepath.IsAbs(c.SocketPath) {
		bad("socket_path", "want an absolute path, got %q", c.SocketPath)
	}
	if _, err := c.SocketFileMode(); err != nil {
		bad("socket_mode", "%w", err)
	}
	if c.TCPAddr != "" {
		if err := checkHostPort(c.TCPAddr); err != nil {
			bad("tcp_addr", "%w", err)
		}
	}
	for _, addr := range c.P2PPeers {
		if err := checkHostPort(addr); err != nil {
			bad("p2p_peers", "%q: %w", addr, err)
		}
		if _, port, _ := net.SplitHostPort(addr); port == "0" {
			bad("p2p_peers", "%q: a peer needs its real port, not 0", addr)
		}
		if addr == c.TCPAddr {
			bad("p2p_peers", "%q is this daemon's own tcp_addr", addr)
		}
	}
	if c.EnableP2P && len(c.P2PPeers) == 0 && c.ControllerURL == "" {
		bad("enable_p2p", "P2P needs peers: set controller_url to find them through the controller, or list the other daemons' tcp_addr in p2p_peers")
	}
	if c.MaxConnections < 1 || c.MaxConnections > maxConnections {
		bad("max_connections", "want 1 to %d, got %d", maxConnections, c.MaxConnections)
	}
	if c.PDReceiveBytes < 0 {
		bad("pd_receive_bytes", "want 0 (automatic) or more, got %d", c.PDReceiveBytes)
	}
	if _, err := netallow.Parse(c.PDPushAllow); err != nil {
		bad("pd_push_allow", "%v", err)
	}
	if c.FrameTimeout <= 0 {
		bad("frame_timeout", "want more than 0, got %v", c.FrameTimeout)
	}
	if c.HandshakeTimeout <= 0 {
		bad("handshake_timeout", "want more than 0, got %v", c.HandshakeTimeout)
	}
	if c.KVEventsEndpoint != "" {
		switch {
		case c.KVEventsPod == "":
			bad("kv_events_pod", "required with kv_events_endpoint: the vLLM pod this daemon serves")
		case c.KVEventsModel == "":
			bad("kv_events_model", "required with kv_events_endpoint: the model the pod serves")
		case c.KVEventsHashSeed == "":
			bad("kv_events_hash_seed", "required with kv_events_endpoint: the pod's PYTHONHASHSEED (without one vLLM's hashes cannot be reproduced)")
		}
	}
	switch {
	case c.KVEventsEncoding != "map" && c.KVEventsEncoding != "array":
		bad("kv_events_encoding", "want map or array, got %q", c.KVEventsEncoding)
	case c.KVEventsBlockSize < 1:
		bad("kv_events_block_size", "want a positive number of tokens, got %d", c.KVEventsBlockSize)
	case c.KVEventsEndpoint != "" && c.ChunkSize%c.KVEventsBlockSize != 0:
		bad("kv_events_block_size", "want a divisor of chunk_size %d, got %d", c.ChunkSize, c.KVEventsBlockSize)
	}
	c.validateCluster(bad)
	if (c.TCPTLSCert == "") != (c.TCPTLSKey == "") {
		bad("tcp_tls_cert", "tcp_tls_cert and tcp_tls_key go together; only one is set")
	}
	if (c.AdminTLSCert == "") != (c.AdminTLSKey == "") {
		bad("admin_tls_cert", "admin_tls_cert and admin_tls_key go together; only one is set")
	}
	if !slices.Contains(directIOModes, c.DiskDirectIO) {
		bad("disk_direct_io", "%w", oneOf(c.DiskDirectIO, directIOModes))
	}
	if c.DiskSegmentSize < minSegmentSize || c.DiskSegmentSize%segmentAlign != 0 {
		bad("disk_segment_size", "want at least %v and a multiple of %v, got %v",
			minSegmentSize, segmentAlign, c.DiskSegmentSize)
	}
	if !slices.Contains(cachePolicies, c.DiskCachePolicy) {
		bad("disk_cache_policy", "%w", oneOf(c.DiskCachePolicy, cachePolicies))
	}
	if c.WriteQueueDepth < 1 || c.WriteQueueDepth > maxWriteQueueDepth {
		bad("write_queue_depth", "want 1 to %d, got %d", maxWriteQueueDepth, c.WriteQueueDepth)
	}
	if c.WriteWait < 0 {
		bad("write_wait", "want 0 or more, got %v", c.WriteWait)
	}
	if c.LeaseTTL <= 0 {
		bad("lease_ttl", "want more than 0, got %v", c.LeaseTTL)
	}
	if !slices.Contains(logLevels, c.LogLevel) {
		bad("log_level", "%w", oneOf(c.LogLevel, logLevels))
	}
	return errors.Join(errs...)
}

// normalize rewrites accepted spellings into the one form the rest of
// kvtier reads. Only local_disk can be unparseable.
func (c *Config) normalize() error {
	c.CachePolicy = strings.ToUpper(strings.TrimSpace(c.CachePolicy))
	c.RemoteSerde = strings.ToLower(strings.TrimSpace(c.RemoteSerde))
	if c.RemoteSerde == "naive" { // LMCache's name for the raw encoding
		c.RemoteSerde = "raw"
	}
	c.DiskDirectIO = strings.ToLower(strings.TrimSpace(c.DiskDirectIO))
	c.DiskCachePolicy = strings.ToUpper(strings.TrimSpace(c.DiskCachePolicy))
	c.LogLevel = strings.ToLower(strings.TrimSpace(c.LogLevel))
	if c.LogLevel == "warning" { // Python's name, for LMCache users
		c.LogLevel = "warn"
	}
	p, err := diskPath(c.LocalDisk)
	if err != nil {
		return &KeyError{Key: "local_disk", Err: err}
	}
	c.LocalDisk = p
	return nil
}

// diskPath turns LMCache's "file:///path" or a plain absolute path into a
// clean absolute path. Like LMCache it strips "file://" textually, so
// "file://cache/" means the relative path "cache/", which is refused: a
// daemon's working directory is no place for a cache.
func diskPath(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	p, isFileURL := strings.CutPrefix(s, "file://")
	if !isFileURL {
		if i := strings.Index(s, "://"); i > 0 {
			return "", fmt.Errorf("want file:///path or an absolute path, got scheme %q", s[:i])
		}
	}
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("want an absolute path such as /var/cache/kvtier or file:///var/cache/kvtier, got %q", clip(s))
	}
	return filepath.Clean(p), nil
}

// checkGiB checks a size in LMCache's GB; it must be above zero when the
// tier it sizes is enabled (why says when that is).
func checkGiB(gib float64, needed bool, why string) error {
	switch {
	case math.IsNaN(gib) || gib < 0 || gib > maxGiB:
		return fmt.Errorf("want 0 to %d (GB), got %v", maxGiB, gib)
	case needed && gib == 0:
		return fmt.Errorf("want more than 0 (GB) when %s", why)
	}
	return nil
}

// checkURL accepts any scheme: the remote tier registry knows which exist.
// Messages show the URL redacted, since it may carry a password.
func checkURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the whole URL, password included
		}
		return fmt.Errorf("want a URL such as redis://host:6379: %w", err)
	}
	switch {
	case u.Scheme == "":
		return fmt.Errorf("want a URL with a scheme, such as redis://host:6379, got %q", redactURL(s))
	case u.Opaque != "":
		// "localhost:6379" parses as scheme "localhost" with an opaque rest,
		// and so does "user:password@host": do not echo the rest.
		return fmt.Errorf("want scheme://host or scheme:///path, got %q followed by no \"//\"", u.Scheme+":")
	case u.Host == "" && u.Path == "":
		return fmt.Errorf("want scheme://host or scheme:///path, got %q", redactURL(s))
	}
	return nil
}

// checkHostPort accepts a listen address as net.Listen takes it: an
// optional host (empty means every interface) and a numeric port. Host
// names are not resolved here, so loading never waits on DNS.
func checkHostPort(s string) error {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("want host:port such as 127.0.0.1:7480, got %q", clip(s))
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || (p == 0 && port != "0") {
		return fmt.Errorf("want a port number 0 to 65535, got %q", clip(port))
	}
	return nil
}

// SocketFileMode parses socket_mode, an octal permission like 0600.
func (c Config) SocketFileMode() (os.FileMode, error) {
	v, err := strconv.ParseUint(c.SocketMode, 8, 32)
	if err != nil || v > 0o777 || v == 0 {
		return 0, fmt.Errorf("want octal permission bits like 0600 or 0660, got %q", c.SocketMode)
	}
	return os.FileMode(v), nil
}

// validateCluster checks the cluster keys: with controller_url, the chunk
// stream's endpoint and the TCP protocol peers pull from are required.
func (c Config) validateCluster(bad func(key, format string, args ...any)) {
	if c.HeartbeatInterval <= 0 {
		bad("heartbeat_interval", "want more than 0, got %v", c.HeartbeatInterval)
	}
	if strings.Contains(c.InstanceID, "@") || strings.ContainsFunc(c.InstanceID, func(r rune) bool { return r <= ' ' || r > '~' }) {
		bad("instance_id", "want printable ASCII without spaces or '@' (the chunk stream's topic separator), got %q", c.InstanceID)
	}
	if c.ControllerURL == "" {
		return
	}
	if _, err := c.ControllerBases(); err != nil {
		bad("controller_url", "%w", err)
	}
	if c.ClusterEventsEndpoint == "" {
		bad("cluster_events_endpoint", "required with controller_url: the ZMQ address the daemon publishes its chunk stream on, e.g. tcp://*:5561")
	}
	if c.TCPAddr == "" {
		bad("tcp_addr", "required with controller_url: peers pull chunks from this daemon over the TCP protocol")
	}
}

// ControllerBase returns the first of controller_url's base URLs (see
// ControllerBases).
func (c Config) ControllerBase() (string, error) {
	bases, err := c.ControllerBases()
	if err != nil {
		return "", err
	}
	return bases[0], nil
}

// ControllerBases returns controller_url as base URLs: one controller,
// or several replicas sharing one registry, separated by commas, asked
// in turn when one fails (docs/cluster.md, "High availability").
// LMCache's controller_pull_url, which maps here, is a bare host:port or
// a ZMQ address tcp://host:port: either is read as http://host:port (the
// kvtier controller's registry answers over HTTP on its listen address).
func (c Config) ControllerBases() ([]string, error) {
	var out []string
	for _, raw := range strings.Split(c.ControllerURL, ",") {
		raw = strings.TrimSpace(raw)
		orig := raw
		if rest, ok := strings.CutPrefix(raw, "tcp://"); ok {
			raw = "http://" + rest
		} else if !strings.Contains(raw, "://") {
			raw = "http://" + raw
		}
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("want http://host:port (or host:port) of the kvtier controller, or several separated by commas, got %q", orig)
		}
		out = append(out, strings.TrimRight(raw, "/"))
	}
	return out, nil
}
