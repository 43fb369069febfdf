package config

import (
	"os"
	"testing"
)

// BenchmarkParseLMCache measures loading a typical file. Configuration is
// read once at start, so this is a sanity figure, not a hot path.
func BenchmarkParseLMCache(b *testing.B) {
	data, err := os.ReadFile("testdata/lmcache.yaml")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(data, "lmcache.yaml"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseSize(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseSize("1.5GiB"); err != nil {
			b.Fatal(err)
		}
	}
}
