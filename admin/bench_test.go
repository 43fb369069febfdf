package admin

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"kvtier/config"
)

// BenchmarkScrape measures one collection of the kvtier metrics: the whole
// cost of observability, paid by the scraper and never by the cache.
func BenchmarkScrape(b *testing.B) {
	f := newFixture(b, config.Default())
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(f.eng))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := reg.Gather(); err != nil {
			b.Fatal(err)
		}
	}
}
