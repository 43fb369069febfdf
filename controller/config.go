package controller

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"gopkg.in/yaml.v3"

	"kvtier/router/index"
)

// Config is the controller's configuration. Every key has a flag of
// `kvtier controller` with the same meaning (see Flag); the flag, when
// given, replaces the file's value. Field order is the order of
// docs/router.md.
type Config struct {
	// Listen is the HTTP address of the score API (POST /v1/score,
	// GET /healthz). Port 0 picks a free port, which the controller logs.
	Listen string `yaml:"listen"`
	// GRPCListen, when set, also serves llm-d's GetPodScores
	// (indexer.v1.IndexerService) on this address.
	GRPCListen string `yaml:"grpc_listen"`
	// GRPCSpecialTokens makes GetPodScores tokenize a prompt with the
	// special tokens the model's tokenizer adds (BOS for Llama 3 style
	// models), as llm-d and vLLM's completion API do, so block keys match
	// the engine's. Off, the prompt is tokenized as is.
	GRPCSpecialTokens bool `yaml:"grpc_special_tokens"`

	// Pods are the pods to subscribe to, NAME=MODEL=ADDRESS[=REPLAY] each.
	Pods []string `yaml:"pods"`
	// PodsFile names a file of more pod specs, one per line, watched for
	// changes while the controller runs.
	PodsFile string `yaml:"pods_file"`

	// HashSeed is the PYTHONHASHSEED of the vLLM pods. It is required, and
	// a pointer because the empty seed is a seed too: nil means "not
	// given", which would make every prompt silently miss.
	HashSeed *string `yaml:"hash_seed"`
	// BlockSize is the pods' vLLM block size in tokens.
	BlockSize int `yaml:"block_size"`

	// MaxBlocks bounds the in-memory index (distinct blocks, least
	// recently used evicted first). It does not apply with IndexRedis.
	MaxBlocks int `yaml:"max_blocks"`
	// IndexRedis, when set, keeps the block index in Redis at this URL,
	// shared by every controller pointed at it, instead of in memory.
	IndexRedis string `yaml:"index_redis"`
	// Scorer names the pod scorer, one of index.ScorerNames.
	Scorer string `yaml:"scorer"`
	// Tokenizers are the tokenizers for prompt strings,
	// [MODEL=]tiktoken:ENCODING or [MODEL=]hf:/path/tokenizer.json each;
	// one without MODEL= serves every model without its own.
	Tokenizers []string `yaml:"tokenizers"`

	// HeartbeatInterval is how often registered kvtier daemons beat; a
	// daemon that misses MissedHeartbeats in a row is dropped with its
	// chunks (docs/cluster.md).
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	MissedHeartbeats  int           `yaml:"missed_heartbeats"`
	// ClusterToken, when set, is the shared secret every request to the
	// registry API (/v1/cluster/*) must present as
	// "Authorization: Bearer <token>"; the daemons' controller_token.
	ClusterToken string `yaml:"cluster_token"`
	// TLSCert and TLSKey, both or neither, serve Listen over TLS; the
	// files are reread on SIGHUP and when they change (docs/security.md).
	TLSCert string `yaml:"tls_cert"`
	TLSKey  string `yaml:"tls_key"`
	// GRPCTLSCert and GRPCTLSKey serve GRPCListen over TLS, and
	// ProxyTLSCert and ProxyTLSKey serve ProxyListen over TLS, reloaded
	// like TLSCert (listeners_tls.go).
	GRPCTLSCert  string `yaml:"grpc_tls_cert"`
	GRPCTLSKey   string `yaml:"grpc_tls_key"`
	ProxyTLSCert string `yaml:"proxy_tls_cert"`
	ProxyTLSKey  string `yaml:"proxy_tls_key"`

	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"log_level"`

	// The prefill/decode proxy (proxy.go, docs/disaggregation.md), on when
	// PrefillInstances and DecodeInstances are set: the first are NAME=URL
	// specs, NAME the pod's name in the index; the second NAME=URL=DAEMON_ADDR specs, DAEMON_ADDR the
	// TCP address of the instance's kvtier daemon. ProxyListen is its own
	// HTTP address; empty serves it on Listen.
	ProxyListen      string        `yaml:"proxy_listen"`
	PrefillInstances []string      `yaml:"prefill"`
	DecodeInstances  []string      `yaml:"decode"`
	PrefillTimeout   time.Duration `yaml:"prefill_timeout"`
	DecodeTimeout    time.Duration `yaml:"decode_timeout"`
}

// Default returns the built-in defaults. HashSeed and the pods have none:
// they describe the fleet, and guessing them would route nothing.
func Default() Config {
	return Config{
		Listen:            "127.0.0.1:7481",
		GRPCSpecialTokens: true,
		BlockSize:         16,
		MaxBlocks:         4_000_000,
		Scorer:            index.ScorerLongestPrefix,
		HeartbeatInterval: DefaultHeartbeatInterval,
		MissedHeartbeats:  DefaultMissedHeartbeats,
		LogLevel:          "info",
		PrefillTimeout:    DefaultPrefillTimeout,
		DecodeTimeout:     DefaultDecodeTimeout,
	}
}

// Keys lists the configuration keys in the order Config declares them.
func Keys() []string {
	return []string{"listen", "grpc_listen", "grpc_special_tokens", "pods", "pods_file", "hash_seed", "block_size",
		"max_blocks", "index_redis", "scorer", "tokenizers", "heartbeat_interval", "missed_heartbeats", "cluster_token", "tls_cert", "tls_key",
		"grpc_tls_cert", "grpc_tls_key", "proxy_tls_cert", "proxy_tls_key", "log_level",
		"proxy_listen", "prefill", "decode", "prefill_timeout", "decode_timeout"}
}

// Flag is the `kvtier controller` flag that sets key: the key with '-'
// for '_', in the singular for the repeatable ones.
func Flag(key string) string {
	switch key {
	case "pods":
		return "pod"
	case "tokenizers":
		return "tokenizer"
	}
	return strings.ReplaceAll(key, "_", "-")
}

// LoadFile decodes the YAML file at path over c (see Decode).
func (c *Config) LoadFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading the controller config: %w", err)
	}
	return c.Decode(data, path)
}

// Decode applies a YAML document of keys to c; keys it does not set, or
// sets to null, keep their values, as in the daemon's configuration. It is
// strict, since a misspelt key would otherwise quietly leave a default in
// place: unknown keys, values of the wrong type and a second document are
// errors. It does not validate, so that flags may still complete the
// configuration. name labels errors, usually the file's path.
func (c *Config) Decode(data []byte, name string) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return fmt.Errorf("%s: %w", name, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: want a single YAML document, found a second one", name)
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null" {
		return nil // only comments
	}
	if root.Kind != yaml.MappingNode {
		return fmt.Errorf("%s:%d: want a mapping of keys to values", name, root.Line)
	}
	if err := dropNulls(root, name); err != nil {
		return err
	}
	next := *c
	if err := root.Decode(&next); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	*c = next
	return nil
}

// dropNulls removes the keys set to null from a mapping, after checking
// every key is one of Keys.
func dropNulls(m *yaml.Node, name string) error {
	var errs []error
	kept := m.Content[:0:0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if !slices.Contains(Keys(), k.Value) {
			errs = append(errs, fmt.Errorf("%s:%d: unknown key %q", name, k.Line, k.Value))
			continue
		}
		if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!null" {
			continue
		}
		kept = append(kept, k, v)
	}
	m.Content = kept
	return errors.Join(errs...)
}

// Validate reports every problem with c that can be found without opening
// anything, each naming the key and its flag. Pods files, tokenizers and
// addresses are checked when the controller opens them.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", which(key), fmt.Sprintf(format, args...)))
	}
	if c.HashSeed == nil {
		bad("hash_seed", "required: the PYTHONHASHSEED the vLLM pods run with")
	}
	if _, err := parsePods(c.Pods); len(c.Pods) > 0 && err != nil {
		bad("pods", "%v", err)
	}
	if c.BlockSize <= 0 {
		bad("block_size", "want a positive number of tokens, got %d", c.BlockSize)
	}
	if c.MaxBlocks <= 0 && c.IndexRedis == "" {
		bad("max_blocks", "want a positive number of blocks, got %d", c.MaxBlocks)
	}
	if c.IndexRedis != "" {
		if _, err := goredis.ParseURL(c.IndexRedis); err != nil {
			bad("index_redis", "%v", err)
		}
	}
	if _, err := index.NewScorer(c.Scorer); err != nil {
		bad("scorer", "%v", err)
	}
	if c.HeartbeatInterval < 10*time.Millisecond {
		bad("heartbeat_interval", "want at least 10ms, got %v", c.HeartbeatInterval)
	}
	if c.MissedHeartbeats < 1 {
		bad("missed_heartbeats", "want at least 1, got %d", c.MissedHeartbeats)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.LogLevel)); err != nil {
		bad("log_level", "want debug, info, warn or error, got %q", c.LogLevel)
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		bad("tls_cert", "tls_cert and tls_key go together; only one is set")
	}
	c.validateListenerTLS(bad)
	errs = append(errs, c.validateProxy()...)
	return errors.Join(errs...)
}

// which names a key and its flag in an error, so that the message points
// at whichever of the two the user wrote.
func which(key string) string { return key + " (--" + Flag(key) + ")" }
