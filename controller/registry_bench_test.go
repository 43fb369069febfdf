package controller

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"kvtier/chunk"
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
	t := newTimings(b)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		t.start()
		sc.out = reg.appendLookup(sc.out[:0], sc)
		t.stop()
	}
	b.StopTimer()
	t.report()
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
	t := newTimings(b)
	w := httptest.NewRecorder()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		req := httptest.NewRequest(http.MethodPost, "/v1/cluster/lookup", bytes.NewReader(body))
		w.Body.Reset()
		t.start()
		reg.ServeHTTP(w, req)
		t.stop()
	}
	b.StopTimer()
	if w.Code != http.StatusOK || !bytes.Contains(w.Body.Bytes(), []byte(`"tier":"disk"`)) {
		b.Fatalf("lookup answered %d: %.200s", w.Code, w.Body.String())
	}
	t.report()
}

// timings records each call's wall time and its thread's CPU time. The
// goroutine is locked to its thread, so that the CPU clock is the
// call's: on a machine shared with other work, the wall-time tail is
// mostly the time the thread waited to be scheduled, which the CPU
// percentiles leave out.
type timings struct {
	b           *testing.B
	wall, cpu   []time.Duration
	wall0, cpu0 time.Time
	cpuStart    time.Duration
}

func newTimings(b *testing.B) *timings {
	runtime.LockOSThread()
	b.Cleanup(runtime.UnlockOSThread)
	return &timings{b: b, wall: make([]time.Duration, 0, b.N), cpu: make([]time.Duration, 0, b.N)}
}

func (t *timings) start() {
	t.cpuStart = threadCPU()
	t.wall0 = time.Now()
}

func (t *timings) stop() {
	t.wall = append(t.wall, time.Since(t.wall0))
	t.cpu = append(t.cpu, threadCPU()-t.cpuStart)
}

// report adds the p50 and p99 of both clocks to the benchmark's line.
func (t *timings) report() {
	for _, c := range []struct {
		name string
		d    []time.Duration
	}{{"", t.wall}, {"cpu-", t.cpu}} {
		slices.Sort(c.d)
		t.b.ReportMetric(float64(c.d[len(c.d)*99/100].Nanoseconds())/1e3, c.name+"p99-µs")
		t.b.ReportMetric(float64(c.d[len(c.d)/2].Nanoseconds())/1e3, c.name+"p50-µs")
	}
}

// benchTokenRegistry is benchRegistry with a 32k-token prompt's chunk
// keys among the 1M, as daemons with 256-token chunks report them.
func benchTokenRegistry(b *testing.B) (*registry, cluster.Scope, []uint32) {
	b.Helper()
	reg, prompt := benchRegistry(b)
	tokens := make([]uint32, benchPrompt*chunk.DefaultSize)
	for i := range tokens {
		tokens[i] = uint32(1000 + i*7919%127000) // Llama 3 sized ids
	}
	scope := cluster.Scope{Model: "meta-llama/Llama-3.1-8B", WorldSize: 1, Format: "bfloat16/KV_2LTD"}
	c, err := chunk.NewChunker(chunk.Scope{Model: scope.Model, WorldSize: 1, Format: scope.Format}, chunk.DefaultSize, false)
	if err != nil {
		b.Fatal(err)
	}
	keys := c.Keys(nil, tokens)
	// The prompt's chunks take the places of the run benchRegistry
	// picked: held by all 8 daemons in RAM, some on disk too.
	table := *reg.daemons.Load()
	for id, d := range table {
		if d == nil {
			continue
		}
		ids := make([]uint64, len(keys))
		for i, k := range keys {
			ids[i] = k.Index()
		}
		reg.ix.Add(index.PodID(id), index.CPU, ids)
		reg.ix.Add(index.PodID(id), index.Disk, ids[:len(ids)/2])
		reg.ix.Remove(index.PodID(id), index.CPU, prompt)
		reg.ix.Remove(index.PodID(id), index.Disk, prompt)
	}
	reg.chunkSize.Store(chunk.DefaultSize)
	return reg, scope, tokens
}

// tokenLookupJSON is the JSON form of a lookup by tokens.
func tokenLookupJSON(scope cluster.Scope, tokens []uint32) []byte {
	body := []byte(`{"scope":`)
	sb, _ := json.Marshal(scope)
	body = append(append(body, sb...), `,"tokens":[`...)
	for i, t := range tokens {
		if i > 0 {
			body = append(body, ',')
		}
		body = strconv.AppendUint(body, uint64(t), 10)
	}
	return append(body, "]}"...)
}

// tokenLookupBinary is the binary form: the tokens little-endian.
func tokenLookupBinary(tokens []uint32) []byte {
	body := make([]byte, 0, 4*len(tokens))
	for _, t := range tokens {
		body = binary.LittleEndian.AppendUint32(body, t)
	}
	return body
}

// BenchmarkClusterLookupTokens measures the whole handler for a lookup
// by tokens: a 32k-token prompt's JSON decoded, cut into 128 chunks and
// hashed, looked up against 1M chunks × 8 daemons, the reply written.
func BenchmarkClusterLookupTokens(b *testing.B) {
	reg, scope, tokens := benchTokenRegistry(b)
	b.Run("json", func(b *testing.B) {
		benchTokenLookup(b, reg, "", "application/json", tokenLookupJSON(scope, tokens))
	})
	b.Run("binary", func(b *testing.B) {
		benchTokenLookup(b, reg, "?"+scope.Query().Encode(), cluster.TokensContentType, tokenLookupBinary(tokens))
	})
}

func benchTokenLookup(b *testing.B, reg *registry, query, contentType string, body []byte) {
	t := newTimings(b)
	w := httptest.NewRecorder()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		req := httptest.NewRequest(http.MethodPost, "/v1/cluster/lookup"+query, bytes.NewReader(body))
		req.Header.Set("Content-Type", contentType)
		w.Body.Reset()
		t.start()
		reg.ServeHTTP(w, req)
		t.stop()
	}
	b.StopTimer()
	var reply cluster.LookupReply
	if err := json.Unmarshal(w.Body.Bytes(), &reply); w.Code != http.StatusOK || err != nil {
		b.Fatalf("lookup answered %d: %.200s", w.Code, w.Body.String())
	}
	if len(reply.Holders) != benchPrompt || len(reply.Holders[0]) != 2*benchDaemons || len(reply.Holders[benchPrompt-1]) != benchDaemons {
		b.Fatalf("holders of %d chunks, %d of the first, %d of the last", len(reply.Holders), len(reply.Holders[0]), len(reply.Holders[benchPrompt-1]))
	}
	t.report()
}
