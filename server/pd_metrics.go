package server

import "github.com/prometheus/client_golang/prometheus"

// pdCollector exposes the transfer state to Prometheus.
type pdCollector struct {
	p                             *pd
	held, waiting, active, pushes *prometheus.Desc
}

func (p *pd) collector() prometheus.Collector {
	return &pdCollector{p: p,
		held: prometheus.NewDesc("kvtier_pd_held_bytes",
			"Bytes of chunks pushed by other daemons held in RAM until read (within pd_receive_bytes).", nil, nil),
		waiting: prometheus.NewDesc("kvtier_pd_receive_waiting",
			"Pushed chunks and per-layer batches waiting for room in pd_receive_bytes, served in arrival order.", nil, nil),
		active: prometheus.NewDesc("kvtier_pd_pushes_active", "Transfers this daemon is pushing.", nil, nil),
		pushes: prometheus.NewDesc("kvtier_pd_pushes_total", "Transfers this daemon pushed that ended, by outcome.",
			[]string{"outcome"}, nil),
	}
}

func (c *pdCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.held
	ch <- c.waiting
	ch <- c.active
	ch <- c.pushes
}

func (c *pdCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.p
	ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(p.budget.used()))
	ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(p.budget.waiting()))
	p.pushMu.Lock()
	active := p.active
	p.pushMu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.active, prometheus.GaugeValue, float64(active))
	ch <- prometheus.MustNewConstMetric(c.pushes, prometheus.CounterValue, float64(p.done.Load()), "done")
	ch <- prometheus.MustNewConstMetric(c.pushes, prometheus.CounterValue, float64(p.failed.Load()), "failed")
}
