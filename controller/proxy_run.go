package controller

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"kvtier/router/api"
)

// validateProxy checks the proxy's settings: instances of both roles or
// of neither, well-formed specs, positive timeouts.
func (c Config) validateProxy() []error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", which(key), fmt.Sprintf(format, args...)))
	}
	if _, err := parseUpstreams("prefill", c.PrefillInstances, false); err != nil {
		bad("prefill", "%v", err)
	}
	if _, err := parseUpstreams("decode", c.DecodeInstances, true); err != nil {
		bad("decode", "%v", err)
	}
	switch {
	case len(c.PrefillInstances) > 0 && len(c.DecodeInstances) == 0:
		bad("decode", "the proxy needs decode instances as well as prefill ones")
	case len(c.DecodeInstances) > 0 && len(c.PrefillInstances) == 0:
		bad("prefill", "the proxy needs prefill instances as well as decode ones")
	case c.ProxyListen != "" && len(c.PrefillInstances) == 0:
		bad("proxy_listen", "set, but no prefill and decode instances to proxy to")
	}
	if c.PrefillTimeout <= 0 {
		bad("prefill_timeout", "want a positive duration, got %v", c.PrefillTimeout)
	}
	if c.DecodeTimeout <= 0 {
		bad("decode_timeout", "want a positive duration, got %v", c.DecodeTimeout)
	}
	return errs
}

// openProxy builds the proxy when cfg names instances, scoring prefill
// instances with the score API's handler.
func openProxy(cfg Config, h *api.Handler, log *slog.Logger) (*proxy, error) {
	if len(cfg.PrefillInstances) == 0 && len(cfg.DecodeInstances) == 0 {
		return nil, nil
	}
	return newProxy(proxyConfig{
		Prefill: cfg.PrefillInstances, Decode: cfg.DecodeInstances,
		PrefillTimeout: cfg.PrefillTimeout, DecodeTimeout: cfg.DecodeTimeout,
		Score: h.Score, Log: log.With("component", "proxy"),
	})
}

// startProxy serves the proxy on proxy_listen, or mounts its routes on
// the controller's mux (whose /healthz is the score API's) when that is
// not set. It returns the function that stops it.
func (c *controller) startProxy(mux *http.ServeMux) (func(), error) {
	if c.proxy == nil {
		return func() {}, nil
	}
	if c.cfg.ProxyListen == "" {
		for _, route := range []string{"/v1/completions", "/v1/chat/completions", "/v1/models"} {
			mux.Handle(route, c.metrics.count("proxy", c.proxy))
		}
		c.log.Info("proxy serving on the controller's address",
			"prefill", len(c.proxy.prefill.list), "decode", len(c.proxy.decode.list))
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", c.cfg.ProxyListen)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", which("proxy_listen"), err)
	}
	ln = withTLS(ln, c.proxyTLS)
	srv := &http.Server{
		Handler:           c.metrics.count("proxy", c.proxy),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(c.log.Handler(), slog.LevelWarn),
	}
	go srv.Serve(ln)
	// Tests and scripts read the bound address here when the port is 0.
	c.log.Info("proxy listening", "addr", ln.Addr().String(), "tls", c.proxyTLS != nil,
		"prefill", len(c.proxy.prefill.list), "decode", len(c.proxy.decode.list))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			c.log.Warn("proxied requests still running at the deadline; closing them", "err", err)
			srv.Close()
		}
	}, nil
}
