package chunk

import (
	"crypto/sha256"
	"testing"
	"time"

	"github.com/zeebo/xxh3"
)

// Each benchmark reports its cost per chunk, block or page and the ratio to
// a baseline measured in the same run: the bare hash function over an input
// of the same length in one contiguous piece. These machines are noisy;
// the ratio is the figure to compare across runs.

// perItem reports ns per item and the ratio to baseline (ns per item).
func perItem(b *testing.B, items int, unit string, baseline float64) {
	ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N) / float64(items)
	b.ReportMetric(ns, "ns/"+unit)
	b.ReportMetric(ns/baseline, "x-baseline")
}

// measureNs returns fn's ns per call, doubling the number of calls until a
// run lasts 100ms. (testing.Benchmark cannot run inside a benchmark.) Call
// it before b.Loop, which resets the timer.
func measureNs(fn func()) float64 {
	for n := 1; ; n *= 2 {
		start := time.Now()
		for range n {
			fn()
		}
		if elapsed := time.Since(start); elapsed >= 100*time.Millisecond {
			return float64(elapsed.Nanoseconds()) / float64(n)
		}
	}
}

var (
	sinkKeys    []Key
	sinkHash    [32]byte
	sinkXXH     xxh3.Uint128
	sinkStrings []string
)

func sha256Baseline(n int) float64 {
	input := make([]byte, n)
	return measureNs(func() { sinkHash = sha256.Sum256(input) })
}

func benchmarkKeys(b *testing.B, numTokens int) {
	c := mustChunker(b, goldenScope, DefaultSize, false)
	tokens := sequentialTokens(numTokens)
	n := c.NumChunks(numTokens)
	dst := make([]Key, 0, n)
	input := make([]byte, 16+4*DefaultSize)
	baseline := measureNs(func() { sinkXXH = xxh3.Hash128(input) })
	b.SetBytes(int64(4 * numTokens))
	b.ReportAllocs()
	for b.Loop() {
		dst = c.Keys(dst[:0], tokens)
	}
	sinkKeys = dst
	perItem(b, n, "chunk", baseline)
}

// BenchmarkKeys: a 2,048-token prompt, 8 chunks of 256 tokens.
func BenchmarkKeys(b *testing.B) { benchmarkKeys(b, 8*DefaultSize) }

// BenchmarkKeys32K: a 32,768-token prompt, 128 chunks of 256 tokens.
func BenchmarkKeys32K(b *testing.B) { benchmarkKeys(b, 32768) }

// BenchmarkVLLMBlockHash: one 16-token block, no extra keys.
func BenchmarkVLLMBlockHash(b *testing.B) {
	h := mustVLLMHasher(b, "0", 16)
	tokens := sequentialTokens(16)
	baseline := sha256Baseline(len(appendBlockInput(nil, &sinkHash, tokens, nil)))
	b.ReportAllocs()
	for b.Loop() {
		sinkHash = h.BlockHash(sinkHash, true, tokens, nil)
	}
	perItem(b, 1, "block", baseline)
}

// BenchmarkVLLMBlockHashes: a 2,048-token prompt (128 blocks of 16) with a
// LoRA name on every block and a cache salt on the first.
func BenchmarkVLLMBlockHashes(b *testing.B) {
	h := mustVLLMHasher(b, "0", 16)
	tokens := sequentialTokens(2048)
	dst := make([][32]byte, 0, 128)
	req := VLLMRequest{LoRAName: "sql-lora", CacheSalt: "salt"}
	baseline := sha256Baseline(len(appendBlockInput(nil, &sinkHash, tokens[:16], []ExtraKey{TextKey(req.LoRAName)})))
	b.ReportAllocs()
	for b.Loop() {
		dst = h.BlockHashes(dst[:0], tokens, req)
	}
	sinkHash = dst[0]
	perItem(b, len(dst), "block", baseline)
}

// BenchmarkSGLangPageHash: one 64-token page chained to a prior hash.
func BenchmarkSGLangPageHash(b *testing.B) {
	tokens := sequentialTokens(64)
	baseline := sha256Baseline(32 + 4*64)
	b.ReportAllocs()
	for b.Loop() {
		sinkHash = SGLangPageHash(sinkHash[:], tokens)
	}
	perItem(b, 1, "page", baseline)
}

// BenchmarkSGLangPageKeys: a 2,048-token prompt in 32 pages of 64, hex keys
// included (one string per page is inherent to SGLang's key type).
func BenchmarkSGLangPageKeys(b *testing.B) {
	tokens := sequentialTokens(2048)
	dst := make([]string, 0, 32)
	baseline := sha256Baseline(32 + 4*64)
	b.ReportAllocs()
	for b.Loop() {
		dst = SGLangPageKeys(dst[:0], tokens, 64)
	}
	sinkStrings = dst
	perItem(b, len(dst), "page", baseline)
}
