package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"kvtier/admin"
	"kvtier/config"
	"kvtier/engine"
	"kvtier/internal/tlsreload"
	"kvtier/kvevents"
	"kvtier/kvevents/announce"
	"kvtier/netallow"
	"kvtier/server"
	"kvtier/tenant"
)

// Shutdown bounds. Together they stay under Kubernetes' default 30 s grace
// period, after which the process would be killed anyway.
const (
	httpDrainTimeout = 5 * time.Second  // in-flight admin requests
	flushTimeout     = 20 * time.Second // queued disk writes
)

// defaultRAMShare is the share of the machine's memory the RAM tier takes
// when nothing sizes it (at most the configured default, LMCache's 5 GB).
const defaultRAMShare = 0.25

func serveCmd() *cobra.Command {
	var configPath string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "run the node daemon",
		Long: `Run the node daemon: the engine (RAM tier, and a disk tier if local_disk is
set) and the HTTP admin API on admin_addr. The configuration is --config, else
the file named by KVTIER_CONFIG_FILE or LMCACHE_CONFIG_FILE, else the built-in
defaults, with LMCACHE_* and then KVTIER_* variables on top. With neither a
file nor KVTIER_MAX_LOCAL_CPU_SIZE (or LMCACHE_MAX_LOCAL_CPU_SIZE), the RAM tier
is sized to the smaller of 5 GiB and a quarter of the machine's memory. SIGTERM or SIGINT shuts it down cleanly; a
second signal kills it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			return runServe(ctx, stop, configPath, cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "configuration file (default: $KVTIER_CONFIG_FILE, then $LMCACHE_CONFIG_FILE, then built-in defaults)")
	return cmd
}

// runServe runs the daemon until ctx is done, then shuts it down. It calls
// unsignal as shutdown starts, so that a second signal kills the process.
func runServe(ctx context.Context, unsignal func(), configPath string, logOut io.Writer) error {
	cfg, err := config.Load(configPath)
	if err != nil {
		return err
	}
	ramDefaulted := sizeRAMForMachine(&cfg, configPath)
	log := newLogger(logOut, cfg.LogLevel)

	opts, err := engine.OptionsFromConfig(cfg, log)
	if err != nil {
		return err
	}
	peers := p2pResolver(cfg, log)
	if peers != nil {
		opts.P2PResolver = peers.resolver()
	}
	eng, err := engine.Open(opts)
	if err != nil {
		return err
	}
	log.Info("engine open", "ram_bytes", opts.RAMBytes, "ram_sized_from_machine", ramDefaulted,
		"policy", cfg.CachePolicy, "chunk_size", cfg.ChunkSize, "disk_dir", cfg.LocalDisk, "disk_bytes", opts.DiskBytes,
		"disk_policy", opts.DiskPolicy)

	tenants, err := tenant.New(cfg, os.Getenv)
	if err != nil {
		return errors.Join(err, eng.Close())
	}
	adm, err := admin.New(eng, cfg, log)
	if err != nil {
		return errors.Join(err, eng.Close())
	}
	if err := adm.SetTenants(tenants); err != nil {
		return errors.Join(err, eng.Close())
	}
	events, err := startEvents(cfg, eng, log)
	if err != nil {
		return errors.Join(err, eng.Close())
	}
	pushAllow, err := netallow.Parse(cfg.PDPushAllow) // validated with the configuration
	if err != nil {
		return errors.Join(err, eng.Close())
	}
	pushTLS, err := dialTLS(cfg.TCPTLSCA)
	if err != nil {
		return errors.Join(err, eng.Close())
	}
	svc := server.NewService(eng, server.ServiceOptions{Token: cfg.TCPToken, Tenants: tenants, Events: events, Logger: log,
		MaxConns: cfg.MaxConnections, FrameTimeout: cfg.FrameTimeout, HandshakeTimeout: cfg.HandshakeTimeout, PDReceiveBytes: int64(cfg.PDReceiveBytes),
		PDPushAllow: pushAllow, PDPushTLS: pushTLS})
	if err := adm.Register(svc.Collectors()...); err != nil {
		return errors.Join(err, eng.Close())
	}
	protoErr := make(chan error, 2)
	tcpAddr, tcpTLS, err := startProtocols(cfg, svc, log, protoErr)
	if err != nil {
		return errors.Join(err, svc.Shutdown(context.Background()), eng.Close())
	}
	if peers != nil {
		peers.setSelf(instanceOf(cfg, tcpAddr), tcpAddr)
	}
	ln, adminTLS, err := adm.Listen()
	if err != nil {
		return errors.Join(err, svc.Shutdown(context.Background()), eng.Close())
	}
	defer tlsreload.OnSIGHUP(adminTLS, tcpTLS)()
	srv := &http.Server{
		Handler:           adm.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	mem, stream, err := startCluster(cfg, eng, opts, adm, tcpAddr, ln.Addr().String(), log)
	if err != nil {
		return errors.Join(err, ln.Close(), svc.Shutdown(context.Background()), eng.Close())
	}
	if stream != nil {
		// Chunks admitted before this are not on the stream, but the
		// controller's first contact asks for a resync, which lists them.
		eng.SetObserver(observers(events, stream))
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	// Tests and scripts read the bound address here when admin_addr has port 0.
	log.Info("admin listening", "addr", ln.Addr().String(), "tls", adminTLS != nil, "token", cfg.AdminToken != "",
		"read_open", cfg.AdminReadOpen)
	memberDone := runMember(ctx, mem)

	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down", "cause", context.Cause(ctx))
	case serveErr = <-served:
		log.Error("admin server failed", "err", serveErr)
	case serveErr = <-protoErr:
		log.Error("cache protocol listener failed", "err", serveErr)
	}
	unsignal()
	<-memberDone // deregistered: peers stop asking this daemon first
	err = shutdown(adm, srv, svc, eng, log)
	if events != nil {
		err = errors.Join(err, events.Close())
	}
	if stream != nil {
		err = errors.Join(err, stream.Close())
	}
	return errors.Join(serveErr, err)
}

// startEvents starts the KV-event publisher when kv_events_endpoint is set
// and makes the local tiers report to it.
func startEvents(cfg config.Config, eng *engine.Engine, log *slog.Logger) (*announce.Publisher, error) {
	if cfg.KVEventsEndpoint == "" {
		return nil, nil
	}
	encoding, err := kvevents.ParseEncoding(cfg.KVEventsEncoding)
	if err != nil {
		return nil, fmt.Errorf("kv_events_encoding: %w", err)
	}
	pub, err := announce.New(announce.Options{Endpoint: cfg.KVEventsEndpoint, Pod: cfg.KVEventsPod,
		Model: cfg.KVEventsModel, HashSeed: cfg.KVEventsHashSeed, BlockSize: cfg.KVEventsBlockSize,
		ChunkTokens: eng.ChunkSize(), Encoding: encoding, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("kv_events_endpoint: %w", err)
	}
	eng.SetObserver(pub)
	log.Info("kv events publishing", "endpoint", pub.Addr(), "pod", cfg.KVEventsPod, "model", cfg.KVEventsModel)
	return pub, nil
}

// startProtocols opens the local socket and, if configured, the TCP
// listener, and serves them in the background; a listener that fails
// later reports on errc. It returns the TCP listener's bound address, ""
// without one, and its certificate's reloader, nil without TLS.
func startProtocols(cfg config.Config, svc *server.Service, log *slog.Logger, errc chan<- error) (string, *tlsreload.Reloader, error) {
	mode, err := cfg.SocketFileMode()
	if err != nil {
		return "", nil, fmt.Errorf("socket_mode: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(cfg.SocketPath), 0o755); err != nil {
		return "", nil, fmt.Errorf("socket_path: %w", err)
	}
	uln, err := server.ListenUnix(cfg.SocketPath, mode)
	if err != nil {
		return "", nil, fmt.Errorf("socket_path: %w", err)
	}
	go func() {
		if err := svc.Serve(uln); err != nil {
			errc <- err
		}
	}()
	log.Info("local protocol listening", "socket", cfg.SocketPath, "mode", fmt.Sprintf("%04o", mode))
	if cfg.TCPAddr == "" {
		return "", nil, nil
	}
	var tlsConf *tls.Config
	var tr *tlsreload.Reloader
	if cfg.TCPTLSCert != "" {
		if tr, err = tlsreload.New("tcp_tls_cert", cfg.TCPTLSCert, cfg.TCPTLSKey, log); err != nil {
			return "", nil, err
		}
		tlsConf = tr.Config()
	}
	tln, err := svc.ListenTCP(cfg.TCPAddr, tlsConf)
	if err != nil {
		return "", nil, fmt.Errorf("tcp_addr: %w", err)
	}
	go func() {
		if err := svc.Serve(tln); err != nil {
			errc <- err
		}
	}()
	log.Info("tcp protocol listening", "addr", tln.Addr().String(), "tls", tlsConf != nil, "token", cfg.TCPToken != "")
	return tln.Addr().String(), tr, nil
}

// shutdown stops the daemon in order: refuse readiness, stop accepting and
// finish in-flight requests, flush queued disk writes, close the engine.
func shutdown(adm *admin.API, srv *http.Server, svc *server.Service, eng *engine.Engine, log *slog.Logger) error {
	adm.Drain()
	var errs []error

	ctx, cancel := context.WithTimeout(context.Background(), httpDrainTimeout)
	if err := svc.Shutdown(ctx); err != nil {
		log.Warn("cache protocol requests still running at the deadline; closed them", "err", err)
	}
	cancel()

	ctx, cancel = context.WithTimeout(context.Background(), httpDrainTimeout)
	if err := srv.Shutdown(ctx); err != nil {
		log.Warn("admin requests still running at the deadline; closing them", "err", err)
		srv.Close()
	}
	cancel()

	ctx, cancel = context.WithTimeout(context.Background(), flushTimeout)
	if err := eng.Flush(ctx); errors.Is(err, engine.ErrNotDurable) {
		log.Warn("some stored chunks are missing from a lower tier (their writes failed and they left RAM)", "err", err)
	} else if err != nil {
		// Close still writes what is queued; this only says it is slow.
		log.Warn("disk writes still queued at the flush deadline", "err", err)
	}
	cancel()

	if err := eng.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing the engine: %w", err))
	}
	err := errors.Join(errs...)
	if err == nil {
		log.Info("stopped")
	}
	return err
}

func newLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo // config validated the level; this is unreachable
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

// sizeRAMForMachine shrinks the RAM tier's default to defaultRAMShare of
// the machine's memory when nothing chose its size: no configuration file
// and no variable for max_local_cpu_size. A size someone wrote down is kept
// as written. It reports whether it changed the size.
func sizeRAMForMachine(cfg *config.Config, configPath string) bool {
	for _, v := range []string{"KVTIER_CONFIG_FILE", "LMCACHE_CONFIG_FILE"} {
		if os.Getenv(v) != "" {
			return false
		}
	}
	if configPath != "" {
		return false
	}
	for _, v := range []string{config.EnvName("max_local_cpu_size"), config.LMCacheEnvName("max_local_cpu_size")} {
		if _, set := os.LookupEnv(v); set {
			return false
		}
	}
	limit, ok := machineMemory()
	if !ok {
		return false
	}
	gib := defaultRAMGiB(cfg.MaxLocalCPUSize, limit)
	if gib == cfg.MaxLocalCPUSize {
		return false
	}
	cfg.MaxLocalCPUSize = gib
	return true
}

// defaultRAMGiB is the RAM tier's size in GiB (LMCache's GB) when nothing
// chose it: the configured default, capped at defaultRAMShare of memBytes.
func defaultRAMGiB(configured float64, memBytes int64) float64 {
	share := float64(memBytes) * defaultRAMShare / float64(config.GiB)
	return min(configured, share)
}

// machineMemory returns the memory this process may use: the machine's
// MemTotal, or the cgroup v2 limit when that is lower (a container).
func machineMemory() (int64, bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	total, err := memTotal(f)
	f.Close()
	if err != nil {
		return 0, false
	}
	if data, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err == nil {
		if limit, ok := cgroupLimit(data); ok && limit < total {
			return limit, true
		}
	}
	return total, true
}

// memTotal reads the MemTotal line of /proc/meminfo ("MemTotal: 123 kB").
func memTotal(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		num, ok := strings.CutSuffix(strings.TrimSpace(rest), " kB")
		kib, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
		if !ok || err != nil || kib <= 0 || kib > 1<<53 {
			return 0, fmt.Errorf("meminfo: bad MemTotal line %.60q", sc.Text())
		}
		return kib << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("meminfo: %w", err)
	}
	return 0, errors.New("meminfo: no MemTotal line")
}

// cgroupLimit parses a cgroup v2 memory.max: a byte count, or "max" for
// no limit (reported as not ok).
func cgroupLimit(data []byte) (int64, bool) {
	v, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return v, err == nil && v > 0
}
