package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"kvtier/chunk"
	"kvtier/router/api"
	"kvtier/router/index"
	"kvtier/router/ingest"
	"kvtier/router/redisindex"
	"kvtier/router/tokenize"
)

// controllerFlags are the flags of `kvtier controller`.
type controllerFlags struct {
	listen     string
	pods       []string
	hashSeed   string
	seedSet    bool
	blockSize  int
	maxBlocks  int
	scorer     string
	logLevel   string
	tokenizers []string
	podsFile   string
	grpcListen string
	indexRedis string
}

func controllerCmd() *cobra.Command {
	var f controllerFlags
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
--block-size; otherwise no prompt ever matches. SIGTERM or SIGINT shuts it
down cleanly; a second signal kills it. See docs/router.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.seedSet = cmd.Flags().Changed("hash-seed")
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			return runController(ctx, stop, f, cmd.ErrOrStderr())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "127.0.0.1:7481", "HTTP address of the score API")
	fl.StringArrayVar(&f.pods, "pod", nil, "a pod to subscribe to, NAME=MODEL=tcp://HOST:PORT[=tcp://HOST:REPLAY_PORT] (repeatable; the model may contain '/')")
	fl.StringVar(&f.hashSeed, "hash-seed", "", "PYTHONHASHSEED of the vLLM pods (required; they must also run --prefix-caching-hash-algo sha256_cbor)")
	fl.IntVar(&f.blockSize, "block-size", 16, "vLLM block size in tokens")
	fl.IntVar(&f.maxBlocks, "max-blocks", 4_000_000, "most distinct blocks the index holds before evicting")
	fl.StringVar(&f.scorer, "scorer", "longest-prefix", "pod scorer: longest-prefix or tier-weighted")
	fl.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fl.StringVar(&f.indexRedis, "index-redis", "", "keep the block index in Redis (redis://[user:pass@]host:port[/db]), shared by every controller pointed at it, instead of in memory")
	fl.StringVar(&f.grpcListen, "grpc-listen", "", "also serve llm-d's gRPC GetPodScores (indexer.v1.IndexerService) on this address")
	fl.StringVar(&f.podsFile, "pods-file", "", "a file of pods, one NAME=MODEL=ADDRESS[=REPLAY] per line (# comments), watched: pods added, removed or changed there are followed, dropped or restarted within seconds")
	fl.StringArrayVar(&f.tokenizers, "tokenizer", nil, "tokenizer for prompt strings: [MODEL=]tiktoken:ENCODING or [MODEL=]hf:/path/tokenizer.json (repeatable; without MODEL= it serves every model without its own)")
	return cmd
}

// podSpec matches NAME=MODEL=ADDRESS[=REPLAY]. The model is everything
// between the first '=' and the '=' that starts the address, so it may hold
// '/', '@' or even '='; addresses never contain '='.
var podSpec = regexp.MustCompile(`^([^=]+)=(.+?)=((?:tcp|ipc)://[^=]+)(?:=((?:tcp|ipc)://[^=]+))?$`)

// loadPods returns the pods of --pod and of --pods-file together, and the
// file's content they were read from.
func loadPods(flags []string, file string) ([]ingest.Endpoint, []byte, error) {
	specs := append([]string(nil), flags...)
	var data []byte
	if file != "" {
		var err error
		if data, err = os.ReadFile(file); err != nil {
			return nil, nil, fmt.Errorf("--pods-file: %w", err)
		}
		lines, err := podsFileLines(file, data)
		if err != nil {
			return nil, nil, err
		}
		specs = append(specs, lines...)
	}
	eps, err := parsePods(specs)
	return eps, data, err
}

// podsFileLines returns the pod specs of a pods file: its lines without
// blank lines and # comments.
func podsFileLines(path string, data []byte) ([]string, error) {
	if len(data) > 4<<20 {
		return nil, fmt.Errorf("--pods-file %s: %d bytes, more than 4 MiB", path, len(data))
	}
	var specs []string
	for _, line := range strings.Split(string(data), "\n") {
		line, _, _ = strings.Cut(line, "#")
		if line = strings.TrimSpace(line); line != "" {
			specs = append(specs, line)
		}
	}
	return specs, nil
}

// podsFilePoll is how often --pods-file is checked for changes.
var podsFilePoll = 2 * time.Second

// watchPods re-reads the pods file whenever its content changes and
// updates the subscriptions. A file that does not parse is reported and
// ignored: the pods followed so far stay as they are.
// loaded is the file's content the current pods came from: a change made
// since is picked up on the first tick.
func watchPods(ctx context.Context, flags []string, file string, loaded []byte, sub *ingest.Subscriber, log *slog.Logger) {
	last := loaded
	tick := time.NewTicker(podsFilePoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		data, err := os.ReadFile(file)
		if err != nil {
			if last != nil { // say it once, not every tick
				log.Warn("pods file unreadable; keeping the current pods", "file", file, "err", err)
				last = nil
			}
			continue
		}
		if bytes.Equal(data, last) {
			continue
		}
		last = data
		lines, err := podsFileLines(file, data)
		var eps []ingest.Endpoint
		if err == nil {
			eps, err = parsePods(append(append([]string(nil), flags...), lines...))
		}
		if err == nil {
			err = sub.Update(eps)
		}
		if err != nil {
			log.Error("pods file rejected; keeping the current pods", "file", file, "err", err)
			continue
		}
		log.Info("pods file reloaded", "file", file, "pods", len(eps))
	}
}

// parsePods turns pod specs into ingest endpoints.
func parsePods(specs []string) ([]ingest.Endpoint, error) {
	if len(specs) == 0 {
		return nil, errors.New("--pod or --pods-file: at least one pod is required")
	}
	seen := make(map[string]bool, len(specs))
	eps := make([]ingest.Endpoint, 0, len(specs))
	for _, spec := range specs {
		m := podSpec.FindStringSubmatch(spec)
		if m == nil {
			return nil, fmt.Errorf("--pod %q: want NAME=MODEL=tcp://HOST:PORT[=tcp://HOST:REPLAY_PORT]", spec)
		}
		if seen[m[1]] {
			return nil, fmt.Errorf("--pod %q: pod %q given twice", spec, m[1])
		}
		seen[m[1]] = true
		eps = append(eps, ingest.Endpoint{Pod: m[1], Model: m[2], Address: m[3], Replay: m[4]})
	}
	return eps, nil
}

// openIndex returns the block index: in memory, or in Redis with
// --index-redis (shared by replicas; --max-blocks does not apply, entries
// expire a day after their last update instead).
func openIndex(f controllerFlags, pods *index.Pods) (index.Store, func(), error) {
	if f.indexRedis == "" {
		ix, err := index.New(index.Config{MaxBlocks: f.maxBlocks})
		if err != nil {
			return nil, nil, fmt.Errorf("--max-blocks: %w", err)
		}
		return ix, func() {}, nil
	}
	opts, err := goredis.ParseURL(f.indexRedis)
	if err != nil {
		return nil, nil, fmt.Errorf("--index-redis: %w", err)
	}
	rdb := goredis.NewClient(opts)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return nil, nil, fmt.Errorf("--index-redis: %w", err)
	}
	ix, err := redisindex.New(redisindex.Config{Client: rdb}, pods)
	if err != nil {
		rdb.Close()
		return nil, nil, err
	}
	return ix, func() { rdb.Close() }, nil
}

// parseTokenizers loads the --tokenizer values into pools, by model; ""
// is the default for models without their own.
func parseTokenizers(specs []string) (func(string) *tokenize.Pool, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	byModel := map[string]*tokenize.Pool{}
	for _, spec := range specs {
		model, which, found := strings.Cut(spec, "=")
		if !found {
			model, which = "", spec
		}
		if _, dup := byModel[model]; dup {
			return nil, fmt.Errorf("--tokenizer %q: model %q has a tokenizer already", spec, model)
		}
		tok, err := tokenize.Open(which)
		if err != nil {
			return nil, fmt.Errorf("--tokenizer %q: %w", spec, err)
		}
		byModel[model] = tokenize.NewPool(tok, tokenize.PoolOptions{})
	}
	return func(model string) *tokenize.Pool {
		if p, ok := byModel[model]; ok {
			return p
		}
		return byModel[""]
	}, nil
}

func parseScorer(name string) (index.Scorer, error) {
	switch name {
	case "longest-prefix":
		return index.LongestPrefix{}, nil
	case "tier-weighted":
		return index.TierWeightedPrefix{Weights: index.DefaultTierWeights()}, nil
	}
	return nil, fmt.Errorf("--scorer %q: want longest-prefix or tier-weighted", name)
}

// runController runs the router until ctx is done, then shuts it down. It
// calls unsignal as shutdown starts, so that a second signal kills the
// process.
func runController(ctx context.Context, unsignal func(), f controllerFlags, logOut io.Writer) error {
	if !f.seedSet {
		return errors.New("--hash-seed is required: the PYTHONHASHSEED the vLLM pods run with")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: level}))
	endpoints, podsFileData, err := loadPods(f.pods, f.podsFile)
	if err != nil {
		return err
	}
	scorer, err := parseScorer(f.scorer)
	if err != nil {
		return err
	}
	hasher, err := chunk.NewVLLMHasher(f.hashSeed, f.blockSize)
	if err != nil {
		return fmt.Errorf("--block-size: %w", err)
	}
	pods := index.NewPods()
	ix, closeIndex, err := openIndex(f, pods)
	if err != nil {
		return err
	}
	defer closeIndex()
	tokenizers, err := parseTokenizers(f.tokenizers)
	if err != nil {
		return err
	}
	handler, err := api.New(api.Config{Index: ix, Pods: pods, Hasher: hasher, Scorer: scorer, Log: log, Tokenizers: tokenizers})
	if err != nil {
		return err
	}
	sub, err := ingest.New(ingest.Config{Endpoints: endpoints}, ix, pods)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return errors.Join(fmt.Errorf("--listen: %w", err), sub.Close())
	}
	if err := sub.Start(ctx); err != nil {
		return errors.Join(err, ln.Close(), sub.Close())
	}
	for _, ep := range endpoints {
		log.Info("subscribing", "pod", ep.Pod, "model", ep.Model, "address", ep.Address, "replay", ep.Replay)
	}
	if f.podsFile != "" {
		go watchPods(ctx, f.pods, f.podsFile, podsFileData, sub, log)
	}

	stopGRPC := func() {}
	if f.grpcListen != "" {
		addr, stop, err := startGRPC(f.grpcListen, handler)
		if err != nil {
			return errors.Join(err, ln.Close(), sub.Close())
		}
		stopGRPC = stop
		log.Info("grpc listening", "addr", addr.String())
	}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	// Tests and scripts read the bound address here when --listen has port 0.
	log.Info("controller listening", "addr", ln.Addr().String(), "scorer", f.scorer,
		"block_size", f.blockSize, "max_blocks", f.maxBlocks)

	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down", "cause", context.Cause(ctx))
	case serveErr = <-served:
		log.Error("score API failed", "err", serveErr)
	}
	unsignal()
	stopGRPC()
	return errors.Join(serveErr, stopController(srv, sub, log))
}

// stopController stops accepting score requests, finishes the ones in
// flight, then closes the event subscriptions.
func stopController(srv *http.Server, sub *ingest.Subscriber, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), httpDrainTimeout)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		log.Warn("score requests still running at the deadline; closing them", "err", err)
		srv.Close()
	}
	if err := sub.Close(); err != nil {
		return fmt.Errorf("closing the event subscriptions: %w", err)
	}
	for pod, st := range sub.Stats() {
		log.Info("pod events", "pod", pod, "messages", st.Messages, "blocks_added", st.BlocksAdded,
			"blocks_removed", st.BlocksRemoved, "malformed", st.Malformed, "lost", st.Lost)
	}
	log.Info("stopped")
	return nil
}
