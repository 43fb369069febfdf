package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"kvtier/chunk"
	"kvtier/engine"
)

const (
	lookupTokens = 32768
	lookupIters  = 2000
	vllmBlock    = 16
	sglangPage   = 64
)

// benchLookup times Lookup of a 32,768-token prompt whose every chunk is in
// RAM: chunking, hashing and the index probe, which is what a scheduler
// pays per request. Chunk payloads are small because Lookup never touches
// them.
func benchLookup(ctx context.Context, r *Report) error {
	e, err := engine.Open(engine.Options{ChunkSize: chunk.DefaultSize, RAMBytes: 64 << 20, Policy: "LRU"})
	if err != nil {
		return err
	}
	defer e.Close()
	req := engine.Request{Scope: chunk.Scope{Model: "bench", WorldSize: 1}, Tokens: benchTokens(lookupTokens, 7)}
	n := lookupTokens / chunk.DefaultSize
	payload := make([][]byte, n)
	for i := range payload {
		payload[i] = make([]byte, 4096)
	}
	if _, err := e.Store(ctx, req, payload); err != nil {
		return err
	}
	lat := make([]time.Duration, lookupIters)
	for i := range lat {
		start := time.Now()
		h, err := e.Lookup(req)
		lat[i] = time.Since(start)
		if err != nil {
			return err
		}
		if h.Tokens != lookupTokens {
			return fmt.Errorf("lookup bench: hit %d of %d tokens", h.Tokens, lookupTokens)
		}
	}
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	slices.Sort(lat)
	r.LookupTokens = lookupTokens
	r.LookupMeanMicros = sum.Seconds() * 1e6 / float64(len(lat))
	r.LookupP99Micros = lat[len(lat)*99/100].Seconds() * 1e6
	return nil
}

// benchHashes reports nanoseconds per unit for each key scheme over the
// same 32,768-token prompt.
func benchHashes(r *Report) {
	tokens := benchTokens(lookupTokens, 11)
	c, _ := chunk.NewChunker(chunk.Scope{Model: "bench", WorldSize: 1}, chunk.DefaultSize, false)
	keys := make([]chunk.Key, 0, lookupTokens/chunk.DefaultSize)
	r.HashChunkTokens = chunk.DefaultSize
	r.HashNsPerChunk = nsPerUnit(lookupTokens/chunk.DefaultSize, func() { keys = c.Keys(keys[:0], tokens) })

	vh, _ := chunk.NewVLLMHasher("0", vllmBlock)
	blocks := make([][32]byte, 0, lookupTokens/vllmBlock)
	r.VLLMBlockTokens = vllmBlock
	r.VLLMNsPerBlock = nsPerUnit(lookupTokens/vllmBlock, func() { blocks = vh.BlockHashes(blocks[:0], tokens, chunk.VLLMRequest{}) })

	pages := make([]string, 0, lookupTokens/sglangPage)
	r.SGLangPageTokens = sglangPage
	r.SGLangNsPerPage = nsPerUnit(lookupTokens/sglangPage, func() { pages = chunk.SGLangPageKeys(pages[:0], tokens, sglangPage) })
}

// nsPerUnit runs fn for about 200ms and returns nanoseconds per unit.
func nsPerUnit(units int, fn func()) float64 {
	fn()
	iters := 0
	start := time.Now()
	for time.Since(start) < 200*time.Millisecond {
		fn()
		iters++
	}
	return float64(time.Since(start).Nanoseconds()) / float64(iters*units)
}

// Print writes r as a table, each figure beside its baseline.
func (r *Report) Print(w io.Writer) {
	if r.LookupsOnly {
		printLookupRates(w, r.Daemon)
		return
	}
	fmt.Fprintf(w, "chunk: %d bytes (%.1f MiB), %d chunks per round\n\n", r.ChunkBytes, float64(r.ChunkBytes)/(1<<20), r.Chunks)
	fmt.Fprintf(w, "%-28s %10s %10s %8s\n", "measurement", "GB/s", "baseline", "ratio")
	fmt.Fprintf(w, "%-28s %10.2f %10s %8s\n", "memcpy (baseline)", r.MemcpyGBps, "", "")
	fmt.Fprintf(w, "%-28s %10.2f %10.2f %8.2f\n", "RAM tier store", r.RAMStoreGBps, r.MemcpyGBps, r.RAMStoreRatio)
	fmt.Fprintf(w, "%-28s %10.2f %10.2f %8.2f\n", "RAM tier retrieve", r.RAMRetrieveGBps, r.MemcpyGBps, r.RAMRetrieveRatio)
	if r.RawReadGBps > 0 {
		fmt.Fprintf(w, "%-28s %10.2f %10s %8s\n", "raw O_DIRECT write (base)", r.RawWriteGBps, "", "")
		fmt.Fprintf(w, "%-28s %10.2f %10s %8s\n", "raw O_DIRECT read (base)", r.RawReadGBps, "", "")
		fmt.Fprintf(w, "%-28s %10.2f %10.2f %8.2f\n", "disk tier write", r.DiskWriteGBps, r.RawWriteGBps, r.DiskWriteRatio)
		fmt.Fprintf(w, "%-28s %10.2f %10.2f %8.2f\n", "disk tier read", r.DiskReadGBps, r.RawReadGBps, r.DiskReadRatio)
		fmt.Fprintf(w, "(disk tier uses O_DIRECT: %v)\n", r.DiskDirectIO)
	}
	fmt.Fprintf(w, "\nlookup of a %d-token prompt: mean %.1f µs, p99 %.1f µs\n", r.LookupTokens, r.LookupMeanMicros, r.LookupP99Micros)
	fmt.Fprintf(w, "hash: kvtier %.0f ns per %d-token chunk, vLLM sha256_cbor %.0f ns per %d-token block, SGLang %.0f ns per %d-token page\n",
		r.HashNsPerChunk, r.HashChunkTokens, r.VLLMNsPerBlock, r.VLLMBlockTokens, r.SGLangNsPerPage, r.SGLangPageTokens)
	if r.Daemon != nil {
		printDaemon(w, r.Daemon)
	}
	printRemoteAndCodecs(w, r)
}
