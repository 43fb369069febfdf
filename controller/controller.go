// Package controller is kvtier's KV-aware router as a running service: it
// owns the wiring of the router packages — KV-event subscriptions
// (router/ingest) into a block index (router/index in memory, or
// router/redisindex), a scorer chosen by name, the score APIs over HTTP
// (router/api) and gRPC (router/grpcapi), tokenizers for prompt strings —
// and the configuration that chooses them (Config, a YAML file whose keys
// `kvtier controller` flags override).
//
// It is also the cluster's registry (registry.go, docs/cluster.md): kvtier
// daemons register, beat and report their chunks on a stream it follows
// into the same index, keyed by chunk.Key.Index under the pod
// "daemon:<instance>", so that one index answers both which pod to route
// to and which daemons hold a chunk (POST /v1/cluster/lookup).
// With index_redis the registry lives in Redis beside the index
// (shared.go), so that controller replicas answer alike and any of them
// can die (docs/cluster.md, "High availability").
//
// With prefill and decode instances configured it is also the
// prefill/decode proxy (proxy.go, docs/disaggregation.md): an OpenAI-compatible
// endpoint that prefills each request on the instance the same index
// scores best and decodes it on the least-loaded one.
//
// The router packages each hold one idea and know nothing of each other's
// lifecycle; this package decides the order in which they start and stop:
// the index before the subscriptions that fill it, the listeners last, and
// on shutdown the score requests in flight finish before the subscriptions
// close.
package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/chunk"
	"kvtier/internal/tlsreload"
	"kvtier/router/api"
	"kvtier/router/grpcapi"
	"kvtier/router/index"
	"kvtier/router/ingest"
	"kvtier/router/redisindex"
	"kvtier/router/tokenize"
)

// drainTimeout bounds the score requests in flight at shutdown, well under
// Kubernetes' default 30 s grace period.
const drainTimeout = 5 * time.Second

// controller is the router's parts, opened but not yet serving.
type controller struct {
	cfg          Config
	log          *slog.Logger
	endpoints    []ingest.Endpoint
	podsFileData []byte // the pods file as the endpoints were read from it
	ix           index.Store
	pods         *index.Pods
	handler      *api.Handler
	sub          *ingest.Subscriber
	reg          membership
	rdb          goredis.UniversalClient // with index_redis: the index's and the registry's
	ops          *opTracker
	proxy        *proxy // nil without prefill and decode instances
	closeIndex   func()

	grpcTLS, proxyTLS *tlsreload.Reloader // nil without grpc_tls_cert, proxy_tls_cert
	metrics           *ctlMetrics         // GET /metrics (metrics.go)
}

// Run validates cfg, runs the controller until ctx is done, then shuts it
// down. Logs go to logOut. It calls unsignal as shutdown starts, so that a
// second signal kills the process.
func Run(ctx context.Context, unsignal func(), cfg Config, logOut io.Writer) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	c, err := open(cfg, newLogger(logOut, cfg.LogLevel))
	if err != nil {
		return err
	}
	defer c.closeIndex()
	return c.serve(ctx, unsignal)
}

func newLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo // Validate checked the level; this is unreachable
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

// open builds every part of the controller from a valid cfg, without
// listening or subscribing yet.
func open(cfg Config, log *slog.Logger) (*controller, error) {
	c := &controller{cfg: cfg, log: log, pods: index.NewPods()}
	var err error
	if c.endpoints, c.podsFileData, err = loadPods(cfg.Pods, cfg.PodsFile); err != nil {
		return nil, err
	}
	if c.ix, c.rdb, c.closeIndex, err = openIndex(cfg, c.pods); err != nil {
		return nil, err
	}
	if c.handler, err = newHandler(cfg, c.ix, c.pods, log); err != nil {
		c.closeIndex()
		return nil, err
	}
	// The registry and the subscriber refer to each other: the registry
	// follows daemons' streams, and streams ask the registry for resyncs.
	// With the index in Redis, so is the registry: replicas share both.
	if c.rdb != nil {
		c.reg = newSharedRegistry(c.rdb, c.ix, c.pods, cfg.HeartbeatInterval, cfg.MissedHeartbeats, log)
	} else {
		c.reg = newRegistry(nil, c.ix, c.pods, cfg.HeartbeatInterval, cfg.MissedHeartbeats, log)
	}
	if c.sub, err = ingest.New(ingest.Config{Endpoints: c.endpoints, OnResync: c.reg.onResync}, c.ix, c.pods); err != nil {
		c.closeIndex()
		return nil, err
	}
	c.reg.attach(c.sub)
	c.ops = newOpTracker(c.reg.registered, log)
	c.ops.hc.Transport = daemonTransport(cfg.ClusterToken)
	c.reg.setDaemonTransport(daemonTransport(cfg.ClusterToken))
	if c.proxy, err = openProxy(cfg, c.handler, log); err != nil {
		c.sub.Close()
		c.closeIndex()
		return nil, err
	}
	return c, nil
}

// newHandler returns the score API over ix with cfg's scorer, hashing and
// tokenizers.
func newHandler(cfg Config, ix index.Store, pods *index.Pods, log *slog.Logger) (*api.Handler, error) {
	scorer, err := index.NewScorer(cfg.Scorer)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", which("scorer"), err)
	}
	hasher, err := chunk.NewVLLMHasher(*cfg.HashSeed, cfg.BlockSize)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", which("block_size"), err)
	}
	tokenizers, err := parseTokenizers(cfg.Tokenizers)
	if err != nil {
		return nil, err
	}
	return api.New(api.Config{Index: ix, Pods: pods, Hasher: hasher, Scorer: scorer, Log: log, Tokenizers: tokenizers})
}

// serve starts the subscriptions and the listeners, serves until ctx is
// done or the score API fails, then stops everything.
func (c *controller) serve(ctx context.Context, unsignal func()) error {
	ln, tr, err := c.listen()
	if err != nil {
		return errors.Join(err, c.sub.Close())
	}
	if err := c.loadListenerTLS(); err != nil {
		return errors.Join(err, ln.Close(), c.sub.Close())
	}
	defer tlsreload.OnSIGHUP(tr, c.grpcTLS, c.proxyTLS)()
	if err := c.sub.Start(ctx); err != nil {
		return errors.Join(err, ln.Close(), c.sub.Close())
	}
	for _, ep := range c.endpoints {
		c.log.Info("subscribing", "pod", ep.Pod, "model", ep.Model, "address", ep.Address, "replay", ep.Replay)
	}
	if c.cfg.PodsFile != "" {
		go watchPods(ctx, c.cfg.Pods, c.cfg.PodsFile, c.podsFileData, c.sub, c.log)
	}
	stopGRPC, err := c.startGRPC()
	if err != nil {
		return errors.Join(err, ln.Close(), c.sub.Close())
	}
	mux := http.NewServeMux()
	// The registry and the operations share the cluster token.
	refused := newRefusedLog(c.log)
	c.metrics = c.newMetrics()
	mux.Handle("/v1/cluster/", c.metrics.count("cluster", clusterGuard(c.cfg.ClusterToken, c.reg, refused)))
	mux.Handle("/v1/cluster/ops", c.metrics.count("cluster", clusterGuard(c.cfg.ClusterToken, c.ops, refused)))
	mux.Handle("/v1/cluster/ops/", c.metrics.count("cluster", clusterGuard(c.cfg.ClusterToken, c.ops, refused)))
	mux.Handle("GET /metrics", c.metrics.handler())
	mux.Handle("/", c.metrics.count("score", c.handler))
	stopProxy, err := c.startProxy(mux)
	if err != nil {
		stopGRPC()
		return errors.Join(err, ln.Close(), c.sub.Close())
	}
	defer stopProxy()
	go c.reg.run(ctx)
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(c.log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	// Tests and scripts read the bound address here when listen has port 0.
	c.log.Info("controller listening", "addr", ln.Addr().String(), "tls", tr != nil, "cluster_token", c.cfg.ClusterToken != "", "scorer", c.cfg.Scorer,
		"block_size", c.cfg.BlockSize, "max_blocks", c.cfg.MaxBlocks)

	var serveErr error
	select {
	case <-ctx.Done():
		c.log.Info("shutting down", "cause", context.Cause(ctx))
	case serveErr = <-served:
		c.log.Error("score API failed", "err", serveErr)
	}
	unsignal()
	stopGRPC()
	return errors.Join(serveErr, c.stop(srv))
}

// startGRPC serves the gRPC API when grpc_listen is set, and returns the
// function that stops it.
func (c *controller) startGRPC() (func(), error) {
	if c.cfg.GRPCListen == "" {
		return func() {}, nil
	}
	addr, stop, err := startGRPC(c.cfg.GRPCListen, c.handler,
		grpcapi.ScorerOptions{NoSpecialTokens: !c.cfg.GRPCSpecialTokens}, c.grpcTLS)
	if err != nil {
		return nil, err
	}
	c.log.Info("grpc listening", "addr", addr.String(), "tls", c.grpcTLS != nil)
	return stop, nil
}

// stop stops accepting score requests, finishes the ones in flight, then
// closes the event subscriptions.
func (c *controller) stop(srv *http.Server) error {
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		c.log.Warn("score requests still running at the deadline; closing them", "err", err)
		srv.Close()
	}
	if err := c.sub.Close(); err != nil {
		return fmt.Errorf("closing the event subscriptions: %w", err)
	}
	for pod, st := range c.sub.Stats() {
		c.log.Info("pod events", "pod", pod, "messages", st.Messages, "blocks_added", st.BlocksAdded,
			"blocks_removed", st.BlocksRemoved, "malformed", st.Malformed, "lost", st.Lost)
	}
	c.log.Info("stopped")
	return nil
}

// openIndex returns the block index: in memory, or in Redis with
// index_redis (shared by replicas; max_blocks does not apply, entries
// expire a day after their last update instead), with the Redis client
// then (nil in memory).
func openIndex(cfg Config, pods *index.Pods) (index.Store, goredis.UniversalClient, func(), error) {
	if cfg.IndexRedis == "" {
		ix, err := index.New(index.Config{MaxBlocks: cfg.MaxBlocks})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%s: %w", which("max_blocks"), err)
		}
		return ix, nil, func() {}, nil
	}
	opts, err := goredis.ParseURL(cfg.IndexRedis)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", which("index_redis"), err)
	}
	rdb := goredis.NewClient(opts)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return nil, nil, nil, fmt.Errorf("%s: %w", which("index_redis"), err)
	}
	ix, err := redisindex.New(redisindex.Config{Client: rdb}, pods)
	if err != nil {
		rdb.Close()
		return nil, nil, nil, err
	}
	return ix, rdb, func() { rdb.Close() }, nil
}

// parseTokenizers loads the tokenizer specs into pools, by model; "" is
// the default for models without their own.
func parseTokenizers(specs []string) (func(string) *tokenize.Pool, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	byModel := map[string]*tokenize.Pool{}
	for _, spec := range specs {
		model, source, found := strings.Cut(spec, "=")
		if !found {
			model, source = "", spec
		}
		if _, dup := byModel[model]; dup {
			return nil, fmt.Errorf("%s %q: model %q has a tokenizer already", which("tokenizers"), spec, model)
		}
		tok, err := tokenize.Open(source)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", which("tokenizers"), spec, err)
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
