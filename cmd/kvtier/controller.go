package main

import (
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"kvtier/controller"
	"kvtier/router/index"
)

// controllerFlags are the flags of `kvtier controller`: --config and one
// flag per key of controller.Config.
type controllerFlags struct {
	config string
	values controller.Config // what the flags say; the defaults show in --help
	seed   string            // --hash-seed; values.HashSeed points here once parsed
}

func controllerCmd() *cobra.Command {
	cmd, _ := newControllerCmd()
	return cmd
}

func newControllerCmd() (*cobra.Command, *controllerFlags) {
	f := &controllerFlags{values: controller.Default()}
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "run the KV-aware router: ingest vLLM KV events, score pods over HTTP",
		Long: `Run the KV-aware router. It subscribes to the KV-cache events of every --pod
(vLLM's --kv-events-config ZMQ publisher), keeps a bounded in-memory index of
which pod holds which prefix block, and answers POST /v1/score on --listen with
each pod's score for a prompt's token ids (GET /healthz for probes).

The router recomputes vLLM's prefix-cache block hashes from the tokens, so the
vLLM pods must run with the same PYTHONHASHSEED as --hash-seed, with
--prefix-caching-hash-algo sha256_cbor, and with the block size of
--block-size; otherwise no prompt ever matches. Every setting may also be
written in a YAML file given with --config (the keys are the flags' names with
'_' for '-', pods and tokenizers as lists); a flag given on the command line
replaces the file's value. SIGTERM or SIGINT shuts it down cleanly; a second
signal kills it. See docs/router.md.

With --prefill and --decode instances it is also a prefill/decode proxy: an
OpenAI-compatible /v1/completions and /v1/chat/completions (on --proxy-listen,
or on --listen) that prefills each request on the instance holding most of its
prompt and decodes it on the least-loaded one. See docs/disaggregation.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := f.load(cmd.Flags().Changed)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			return controller.Run(ctx, stop, cfg, cmd.ErrOrStderr())
		},
	}
	v, fl := &f.values, cmd.Flags()
	fl.StringVar(&f.config, "config", "", "YAML file of controller settings (keys in docs/router.md); flags given here override it")
	fl.StringVar(&v.Listen, "listen", v.Listen, "HTTP address of the score API")
	fl.StringArrayVar(&v.Pods, "pod", nil, "a pod to subscribe to, NAME=MODEL=tcp://HOST:PORT[=tcp://HOST:REPLAY_PORT] (repeatable; the model may contain '/')")
	fl.StringVar(&f.seed, "hash-seed", "", "PYTHONHASHSEED of the vLLM pods (required; they must also run --prefix-caching-hash-algo sha256_cbor)")
	fl.IntVar(&v.BlockSize, "block-size", v.BlockSize, "vLLM block size in tokens")
	fl.IntVar(&v.MaxBlocks, "max-blocks", v.MaxBlocks, "most distinct blocks the index holds before evicting")
	fl.StringVar(&v.Scorer, "scorer", v.Scorer, "pod scorer: "+strings.Join(index.ScorerNames(), ", "))
	fl.StringVar(&v.LogLevel, "log-level", v.LogLevel, "log level: debug, info, warn or error")
	fl.StringVar(&v.IndexRedis, "index-redis", "", "keep the block index in Redis (redis://[user:pass@]host:port[/db]), shared by every controller pointed at it, instead of in memory")
	fl.StringVar(&v.GRPCListen, "grpc-listen", "", "also serve llm-d's gRPC GetPodScores (indexer.v1.IndexerService) on this address")
	fl.BoolVar(&v.GRPCSpecialTokens, "grpc-special-tokens", v.GRPCSpecialTokens, "gRPC GetPodScores tokenizes with the tokenizer's special tokens (BOS), as llm-d and vLLM do")
	fl.StringVar(&v.PodsFile, "pods-file", "", "a file of pods, one NAME=MODEL=ADDRESS[=REPLAY] per line (# comments), watched: pods added, removed or changed there are followed, dropped or restarted within seconds")
	fl.DurationVar(&v.HeartbeatInterval, "heartbeat-interval", v.HeartbeatInterval, "how often registered kvtier daemons beat (docs/cluster.md)")
	fl.IntVar(&v.MissedHeartbeats, "missed-heartbeats", v.MissedHeartbeats, "beats a daemon may miss before it is dropped with its chunks")
	fl.StringVar(&v.ClusterToken, "cluster-token", "", "require Authorization: Bearer TOKEN on the cluster API (/v1/cluster/*), required beyond loopback; the daemons' controller_token (default $KVTIER_CLUSTER_TOKEN; prefer it or the file: flags show in ps)")
	fl.StringVar(&v.TLSCert, "tls-cert", "", "serve --listen over TLS with this PEM certificate (with --tls-key); reread on SIGHUP and on change")
	fl.StringVar(&v.TLSKey, "tls-key", "", "the PEM private key of --tls-cert")
	fl.StringVar(&v.GRPCTLSCert, "grpc-tls-cert", "", "serve --grpc-listen over TLS with this PEM certificate (with --grpc-tls-key); reread on SIGHUP and on change")
	fl.StringVar(&v.GRPCTLSKey, "grpc-tls-key", "", "the PEM private key of --grpc-tls-cert")
	fl.StringVar(&v.ProxyTLSCert, "proxy-tls-cert", "", "serve --proxy-listen over TLS with this PEM certificate (with --proxy-tls-key); reread on SIGHUP and on change")
	fl.StringVar(&v.ProxyTLSKey, "proxy-tls-key", "", "the PEM private key of --proxy-tls-cert")
	fl.StringArrayVar(&v.Tokenizers, "tokenizer", nil, "tokenizer for prompt strings: [MODEL=]tiktoken:ENCODING or [MODEL=]hf:/path/tokenizer.json (repeatable; without MODEL= it serves every model without its own)")
	fl.StringVar(&v.ProxyListen, "proxy-listen", "", "serve the prefill/decode proxy on this address instead of --listen (docs/disaggregation.md)")
	fl.StringArrayVar(&v.PrefillInstances, "prefill", nil, "a prefill vLLM instance for the proxy, NAME=http://HOST:PORT, NAME its pod in the index (repeatable)")
	fl.StringArrayVar(&v.DecodeInstances, "decode", nil, "a decode vLLM instance for the proxy, NAME=http://HOST:PORT=DAEMON_HOST:PORT, the last its kvtier daemon's tcp_addr (repeatable)")
	fl.DurationVar(&v.PrefillTimeout, "prefill-timeout", v.PrefillTimeout, "how long the proxy waits for a prefill instance's answer")
	fl.DurationVar(&v.DecodeTimeout, "decode-timeout", v.DecodeTimeout, "how long the proxy relays a decode instance's answer, to its last byte")
	return cmd, f
}

// load returns the configuration: the defaults, then the --config file,
// then $KVTIER_CLUSTER_TOKEN when set, then every flag for which changed
// reports that it was given.
func (f *controllerFlags) load(changed func(flag string) bool) (controller.Config, error) {
	cfg := controller.Default()
	if f.config != "" {
		if err := cfg.LoadFile(f.config); err != nil {
			return controller.Config{}, err
		}
	}
	// The token from the environment keeps it out of the process list,
	// where --cluster-token shows, and out of a ConfigMap-mounted file.
	if tok := os.Getenv("KVTIER_CLUSTER_TOKEN"); tok != "" {
		cfg.ClusterToken = tok
	}
	f.values.HashSeed = &f.seed
	for _, key := range controller.Keys() {
		if changed(controller.Flag(key)) {
			setKey(&cfg, f.values, key)
		}
	}
	return cfg, nil
}

// setKey copies one key's value from src to dst.
func setKey(dst *controller.Config, src controller.Config, key string) {
	switch key {
	case "listen":
		dst.Listen = src.Listen
	case "grpc_listen":
		dst.GRPCListen = src.GRPCListen
	case "grpc_special_tokens":
		dst.GRPCSpecialTokens = src.GRPCSpecialTokens
	case "pods":
		dst.Pods = src.Pods
	case "pods_file":
		dst.PodsFile = src.PodsFile
	case "hash_seed":
		dst.HashSeed = src.HashSeed
	case "block_size":
		dst.BlockSize = src.BlockSize
	case "max_blocks":
		dst.MaxBlocks = src.MaxBlocks
	case "index_redis":
		dst.IndexRedis = src.IndexRedis
	case "scorer":
		dst.Scorer = src.Scorer
	case "tokenizers":
		dst.Tokenizers = src.Tokenizers
	case "heartbeat_interval":
		dst.HeartbeatInterval = src.HeartbeatInterval
	case "missed_heartbeats":
		dst.MissedHeartbeats = src.MissedHeartbeats
	case "cluster_token":
		dst.ClusterToken = src.ClusterToken
	case "tls_cert":
		dst.TLSCert = src.TLSCert
	case "tls_key":
		dst.TLSKey = src.TLSKey
	case "grpc_tls_cert":
		dst.GRPCTLSCert = src.GRPCTLSCert
	case "grpc_tls_key":
		dst.GRPCTLSKey = src.GRPCTLSKey
	case "proxy_tls_cert":
		dst.ProxyTLSCert = src.ProxyTLSCert
	case "proxy_tls_key":
		dst.ProxyTLSKey = src.ProxyTLSKey
	case "log_level":
		dst.LogLevel = src.LogLevel
	case "proxy_listen":
		dst.ProxyListen = src.ProxyListen
	case "prefill":
		dst.PrefillInstances = src.PrefillInstances
	case "decode":
		dst.DecodeInstances = src.DecodeInstances
	case "prefill_timeout":
		dst.PrefillTimeout = src.PrefillTimeout
	case "decode_timeout":
		dst.DecodeTimeout = src.DecodeTimeout
	default:
		panic("kvtier controller: no flag for key " + key) // caught by TestControllerFlags
	}
}
