// Package admin is the node daemon's HTTP admin API: liveness and
// readiness probes, Prometheus metrics, a small JSON API (stats, effective
// configuration, scopes and keys, clear, flush) and an embedded live
// dashboard (package dashboard). It reaches the cache only through the
// engine; the cache protocol (package server) is another door onto the
// same engine and adds its own metrics with Register.
//
// Nothing here sits on the cache's hot paths. Metrics are not counted by
// the admin server: a custom collector reads the counters the tiers and
// the manager already keep, at scrape time, so a store or a lookup pays
// nothing for being observable.
package admin

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"kvtier/admin/dashboard"
	"kvtier/config"
	"kvtier/engine"
)

// API serves the HTTP admin API of one engine. Safe for concurrent use.
type API struct {
	eng      *engine.Engine
	cfg      config.Config
	log      *slog.Logger
	draining atomic.Bool
	handler  http.Handler
	registry *prometheus.Registry
	mux      *http.ServeMux
	guard    *guard
}

// New returns the admin API of eng, which was opened from cfg. The
// engine must stay open until the HTTP server using Handler has shut down.
func New(eng *engine.Engine, cfg config.Config, log *slog.Logger) (*API, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := prometheus.NewRegistry()
	a := &API{eng: eng, cfg: cfg, log: log, registry: reg}
	for _, c := range []prometheus.Collector{
		newCollector(eng),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("admin: registering metrics: %w", err)
		}
	}
	metrics := promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelError),
		ErrorHandling: promhttp.ContinueOnError, // a partial scrape beats none
	})

	// Method patterns make the mux answer 405 with an Allow header for a
	// known path and a wrong method, and 404 for unknown paths.
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", a.healthz)
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /api/v1/stats", a.stats)
	mux.HandleFunc("GET /api/v1/config", a.config)
	mux.HandleFunc("POST /api/v1/clear", a.clear)
	mux.HandleFunc("POST /api/v1/flush", a.flush)
	mux.HandleFunc("GET /api/v1/scopes", a.scopes)
	mux.HandleFunc("GET /api/v1/keys", a.keys)
	a.routeClusterOps(mux)
	// The dashboard at the root (and /dashboard/): exactly "/" so that
	// unknown paths keep answering 404 from the mux, not the dashboard.
	dash := dashboard.Handler()
	mux.Handle("GET /{$}", dash)
	mux.Handle("GET /dashboard/{$}", dash)
	mux.Handle("GET /dashboard/{file}", dash)
	mux.Handle("GET /{file}", dash)
	a.guard = newGuard(cfg.AdminToken, cfg.ControllerToken, cfg.AdminReadOpen, mux, log)
	a.handler = a.guard
	a.mux = mux
	return a, nil
}

// Register adds collectors to the metrics the admin server exports, such
// as the cache protocol's (Service.Collectors).
func (a *API) Register(cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := a.registry.Register(c); err != nil {
			return fmt.Errorf("admin: registering metrics: %w", err)
		}
	}
	return nil
}

// Handler returns the admin API's HTTP handler.
func (a *API) Handler() http.Handler { return a.handler }

// Drain marks the daemon as shutting down: /readyz answers 503 from now
// on, so load balancers stop sending work while in-flight requests finish.
func (a *API) Drain() { a.draining.Store(true) }

// healthz answers while the process can serve HTTP at all.
func (a *API) healthz(w http.ResponseWriter, _ *http.Request) {
	writeText(w, http.StatusOK, "ok\n")
}

// readyz answers 200 while the engine is open and not shutting down.
func (a *API) readyz(w http.ResponseWriter, _ *http.Request) {
	if a.draining.Load() {
		writeText(w, http.StatusServiceUnavailable, "shutting down\n")
		return
	}
	writeText(w, http.StatusOK, "ready\n")
}

func (a *API) stats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, a.eng.Stats())
}

func (a *API) config(w http.ResponseWriter, _ *http.Request) {
	body, err := configJSON(a.cfg)
	if err != nil {
		a.log.Error("rendering the configuration", "err", err)
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(body)
}

func writeText(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	w.Write([]byte(body))
}

// writeJSON writes v indented, for people reading it with curl.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.MarshalIndent(v, "", "  ")
	if err != nil { // only our own types get here, and they all encode
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

// writeError reports err as {"error": "..."}.
func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, map[string]string{"error": err.Error()})
}

// HandleClusterResync serves POST /api/v1/cluster/resync, through which
// the controller asks this daemon to publish its whole inventory again
// (docs/cluster.md). start must only start the resync: the controller's
// request is answered 202 at once. Call it before serving.
func (a *API) HandleClusterResync(start func()) {
	a.mux.HandleFunc("POST /api/v1/cluster/resync", func(w http.ResponseWriter, _ *http.Request) {
		start()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		w.Write([]byte("{\"started\":true}\n"))
	})
}
