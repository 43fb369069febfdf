package controller

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"kvtier/cluster"
	"kvtier/router/index"
)

// Lookup benchmark shape (issue 13): a 32k-token prompt in 256-token
// chunks against an index of 1M chunks held by each of 8 daemons.
const (
	benchChunks  = 1 << 20
	benchDaemons = 8
	benchPrompt  = 128
)

// benchRegistry builds the index once per benchmark run: every chunk in
// every daemon's RAM, half of them on disk too.
func benchRegistry(b *testing.B) (*registry, []uint64) {
	b.Helper()
	ix, err := index.New(index.Config{MaxBlocks: benchChunks, Preallocate: true})
	if err != nil {
		b.Fatal(err)
	}
	pods := index.NewPods()
	reg := newRegistry(nil, ix, pods, time.Second, 3, slog.New(slog.DiscardHandler))
	keys := make([]uint64, benchChunks)
	for i := range keys {
		keys[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	for d := range benchDaemons {
		name := fmt.Sprintf("d%d", d)
		id, err := pods.Intern(cluster.HolderPrefix + name)
		if err != nil {
			b.Fatal(err)
		}
		reg.members[name] = &daemonRecord{reg: cluster.Register{Instance: name, Addr: fmt.Sprintf("10.0.0.%d:7482", d)}}
		ix.Add(id, index.CPU, keys)
		ix.Add(id, index.Disk, keys[:len(keys)/2])
	}
	reg.publishLocked()
	// A prompt's chunks are a run of the keys, from the middle so that
	// some are on disk too.
	start := len(keys)/2 - benchPrompt/2
	return reg, slices.Clone(keys[start : start+benchPrompt])
}

// BenchmarkClusterLookup measures the lookup's work after the request is
// decoded: index reads and the JSON reply. It reports p99 per lookup.
func BenchmarkClusterLookup(b *testing.B) {
	reg, prompt := benchRegistry(b)
	sc := &lookupScratch{keys: prompt}
	took := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		sc.out = reg.appendLookup(sc.out[:0], sc)
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	reportP99(b, took)
}

// BenchmarkClusterLookupHTTP measures the whole handler in process: the
// JSON request decoded, the lookup, the reply written.
func BenchmarkClusterLookupHTTP(b *testing.B) {
	reg, prompt := benchRegistry(b)
	body := []byte(`{"keys":[`)
	for i, k := range prompt {
		if i > 0 {
			body = append(body, ',')
		}
		body = cluster.AppendHexKey(body, k)
	}
	body = append(body, "]}"...)
	took := make([]time.Duration, 0, b.N)
	w := httptest.NewRecorder()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		req := httptest.NewRequest(http.MethodPost, "/v1/cluster/lookup", bytes.NewReader(body))
		w.Body.Reset()
		start := time.Now()
		reg.ServeHTTP(w, req)
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	if w.Code != http.StatusOK || !bytes.Contains(w.Body.Bytes(), []byte(`"tier":"disk"`)) {
		b.Fatalf("lookup answered %d: %.200s", w.Code, w.Body.String())
	}
	reportP99(b, took)
}

func reportP99(b *testing.B, took []time.Duration) {
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)*99/100].Nanoseconds())/1e3, "p99-µs")
	b.ReportMetric(float64(took[len(took)/2].Nanoseconds())/1e3, "p50-µs")
}
