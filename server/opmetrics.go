package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvtier/wire"
)

// opMetrics counts the cache protocol's requests by operation. Histograms
// are pre-bound per operation, so observing one is a few atomic adds: no
// label lookup, no allocation on the request path.
type opMetrics struct {
	requests *prometheus.CounterVec
	errors   *prometheus.CounterVec
	seconds  *prometheus.HistogramVec

	byOp [wire.MaxOp + 1]opObservers
}

type opObservers struct {
	requests, errors prometheus.Counter
	seconds          prometheus.Observer
}

func newOpMetrics() *opMetrics {
	m := &opMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvtier_requests_total",
			Help: "Cache protocol requests served, by operation."}, []string{"op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvtier_request_errors_total",
			Help: "Cache protocol requests that failed, by operation."}, []string{"op"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvtier_request_seconds",
			Help:    "Time to serve a cache protocol request, by operation.",
			Buckets: prometheus.ExponentialBuckets(5e-6, 4, 10)}, []string{"op"}),
	}
	for op := wire.Op(1); op <= wire.MaxOp; op++ {
		name := op.String()
		m.byOp[op] = opObservers{requests: m.requests.WithLabelValues(name),
			errors: m.errors.WithLabelValues(name), seconds: m.seconds.WithLabelValues(name)}
	}
	return m
}

func (m *opMetrics) observe(op wire.Op, start time.Time, err *requestError) {
	if !op.Valid() {
		return
	}
	o := &m.byOp[op]
	o.requests.Inc()
	if err != nil {
		o.errors.Inc()
	}
	o.seconds.Observe(time.Since(start).Seconds())
}

// Collectors returns the service's Prometheus collectors, for the admin
// server's registry.
func (s *Service) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		s.metrics.requests, s.metrics.errors, s.metrics.seconds,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvtier_client_connections",
			Help: "Open cache protocol connections (local socket and TCP)."},
			func() float64 { return float64(s.Connections()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvtier_connections_refused_total",
			Help: "Connections turned away because max_connections were open."},
			func() float64 { return float64(s.refused.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvtier_leases_expired_total",
			Help: "Client leases that expired before being released (their memory was reclaimed)."},
			func() float64 { return float64(s.eng.LeasesExpired()) }),
		s.pd.collector(),
	}
}
