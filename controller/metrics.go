package controller

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"kvtier/router/index"
)

// The controller's Prometheus metrics (GET /metrics on listen,
// docs/metrics.md#controller): the index's size, the pods and daemons it
// follows, each pod's KV-event stream, the requests each of its APIs
// answered, and the proxy's requests in flight. Everything but the
// request counters is read at scrape time from counters the pieces keep
// anyway. /metrics is open like the score API: it shows counts, no keys,
// prompts or addresses beyond the pods' names.

type ctlMetrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
}

func (c *controller) newMetrics() *ctlMetrics {
	m := &ctlMetrics{reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvtier_controller_requests_total",
			Help: "HTTP requests the controller answered, by API (score, cluster, proxy), route and status code."},
			[]string{"api", "route", "code"})}
	m.reg.MustRegister(m.requests, &ctlCollector{c: c})
	return m
}

// handler serves the registry in the Prometheus text format.
func (m *ctlMetrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// routes are the route labels of each API: the paths it serves, so that a
// client probing paths cannot make a series per path.
var routes = map[string]map[string]string{
	"score": {"/v1/score": "score", "/healthz": "healthz"},
	"cluster": {"/v1/cluster/register": "register", "/v1/cluster/heartbeat": "heartbeat",
		"/v1/cluster/deregister": "deregister", "/v1/cluster/lookup": "lookup",
		"/v1/cluster/instances": "instances", "/v1/cluster/ops": "ops"},
	"proxy": {"/v1/completions": "completions", "/v1/chat/completions": "chat_completions", "/v1/models": "models"},
}

// count wraps h so that its answers count in kvtier_controller_requests_total.
func (m *ctlMetrics) count(api string, h http.Handler) http.Handler {
	known := routes[api]
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		route, ok := known[req.URL.Path]
		if !ok && api == "cluster" && strings.HasPrefix(req.URL.Path, "/v1/cluster/ops/") {
			route, ok = "ops", true
		}
		if !ok {
			route = "other"
		}
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(sw, req)
		m.requests.WithLabelValues(api, route, strconv.Itoa(sw.code)).Inc()
	})
}

// statusWriter remembers the status code written. Unwrap lets
// http.ResponseController reach the connection's Flush (the proxy
// streams answers).
type statusWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.code, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

var (
	ctlBlocksDesc    = prometheus.NewDesc("kvtier_controller_index_blocks", "Distinct blocks the in-memory index holds (absent with index_redis).", nil, nil)
	ctlEntriesDesc   = prometheus.NewDesc("kvtier_controller_index_entries", "(block, pod) holdings in the in-memory index.", nil, nil)
	ctlIxEvictDesc   = prometheus.NewDesc("kvtier_controller_index_evictions_total", "Blocks the in-memory index evicted to stay within max_blocks.", nil, nil)
	ctlPodsDesc      = prometheus.NewDesc("kvtier_controller_pods", "Pods the index knows: subscribed vLLM pods and registered daemons.", nil, nil)
	ctlDaemonsDesc   = prometheus.NewDesc("kvtier_controller_daemons", "kvtier daemons registered in the cluster registry.", nil, nil)
	ctlMessagesDesc  = prometheus.NewDesc("kvtier_controller_event_messages_total", "KV-event messages received from the pod (live and replayed).", []string{"pod"}, nil)
	ctlAddedDesc     = prometheus.NewDesc("kvtier_controller_event_blocks_added_total", "Blocks the pod's events added to the index.", []string{"pod"}, nil)
	ctlRemovedDesc   = prometheus.NewDesc("kvtier_controller_event_blocks_removed_total", "Blocks the pod's events removed from the index.", []string{"pod"}, nil)
	ctlLostDesc      = prometheus.NewDesc("kvtier_controller_event_lost_total", "The pod's event messages missed and not recovered by replay.", []string{"pod"}, nil)
	ctlMalformedDesc = prometheus.NewDesc("kvtier_controller_event_malformed_total", "The pod's event messages skipped as undecodable.", []string{"pod"}, nil)
	ctlInflightDesc  = prometheus.NewDesc("kvtier_controller_proxy_inflight", "Requests the proxy has in flight on the instance.", []string{"role", "instance"}, nil)
)

// ctlCollector reads the controller's state at scrape time.
type ctlCollector struct{ c *controller }

func (cc *ctlCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{ctlBlocksDesc, ctlEntriesDesc, ctlIxEvictDesc, ctlPodsDesc, ctlDaemonsDesc,
		ctlMessagesDesc, ctlAddedDesc, ctlRemovedDesc, ctlLostDesc, ctlMalformedDesc, ctlInflightDesc} {
		ch <- d
	}
}

func (cc *ctlCollector) Collect(ch chan<- prometheus.Metric) {
	c := cc.c
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	if ix, ok := c.ix.(interface{ Stats() index.Stats }); ok {
		st := ix.Stats()
		gauge(ctlBlocksDesc, float64(st.Blocks))
		gauge(ctlEntriesDesc, float64(st.Entries))
		counter(ctlIxEvictDesc, st.Evictions)
	}
	gauge(ctlPodsDesc, float64(c.pods.Len()))
	if ds, err := c.reg.registered(); err == nil {
		gauge(ctlDaemonsDesc, float64(len(ds)))
	}
	for pod, st := range c.sub.Stats() {
		counter(ctlMessagesDesc, st.Messages, pod)
		counter(ctlAddedDesc, st.BlocksAdded, pod)
		counter(ctlRemovedDesc, st.BlocksRemoved, pod)
		counter(ctlLostDesc, st.Lost, pod)
		counter(ctlMalformedDesc, st.Malformed, pod)
	}
	if c.proxy != nil {
		for _, p := range []*pool{c.proxy.prefill, c.proxy.decode} {
			for _, u := range p.list {
				gauge(ctlInflightDesc, float64(u.inflight.Load()), p.role, u.name)
			}
		}
	}
}
