package tokenize

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// englishText is a few KB of plain English prose, built deterministically
// from sentences of ordinary vocabulary.
func englishText(size int) string {
	sentences := []string{
		"The committee met on Tuesday to review the budget for the coming year.",
		"Several members raised concerns about the cost of maintaining the old bridge, which has needed repairs since the storm.",
		"After a long discussion, they agreed to ask the city engineer for a detailed estimate.",
		"Meanwhile, the library reported that visits had grown by almost twelve percent since the new reading room opened.",
		"Children's programs were especially popular, and volunteers said they couldn't keep up with demand.",
		"It's not clear whether the council will approve the extra funding before the summer.",
		"Residents who want to comment can write to the clerk or attend the public hearing next month.",
		"The weather was unusually warm for the season, so many people walked rather than drove to the meeting.",
	}
	rng := rand.New(rand.NewPCG(11, 12))
	var b strings.Builder
	for b.Len() < size {
		b.WriteString(sentences[rng.IntN(len(sentences))])
		if rng.IntN(5) == 0 {
			b.WriteString("\n\n")
		} else {
			b.WriteByte(' ')
		}
	}
	return b.String()[:size]
}

func benchmarkTokenizers(b *testing.B) []Tokenizer {
	return []Tokenizer{cl100kHF(b), tiktokenOf(b, "cl100k_base"), tiktokenOf(b, "o200k_base")}
}

// BenchmarkEncode reports tokens/s on 4 KB of English for each tokenizer.
func BenchmarkEncode(b *testing.B) {
	text := englishText(4 << 10)
	for _, tok := range benchmarkTokenizers(b) {
		b.Run(tok.Name(), func(b *testing.B) {
			dst := mustEncode(b, tok, text)
			n := len(dst)
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				dst, _ = tok.Encode(text, dst[:0])
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// BenchmarkPoolSharedPrefix encodes 8 KB prompts that share their first 90%
// (a new tail each time) through a pool with and without the prefix cache.
func BenchmarkPoolSharedPrefix(b *testing.B) {
	const size = 8 << 10
	shared := englishText(size * 9 / 10)
	rng := rand.New(rand.NewPCG(13, 14))
	prompts := make([]string, 64)
	for i := range prompts {
		// A different slice of prose per prompt, on one line so that no part
		// of the tail is ever cached: every iteration pays for its tail.
		tail := strings.ReplaceAll(englishText(size), "\n", " ")
		start := rng.IntN(len(tail) - size/10)
		prompts[i] = shared + "\n" + tail[start:start+size/10-1]
	}
	for _, tok := range []Tokenizer{cl100kHF(b), tiktokenOf(b, "cl100k_base")} {
		for _, cached := range []bool{false, true} {
			opts := PoolOptions{}
			if !cached {
				opts.CacheBytes = -1
			}
			b.Run(fmt.Sprintf("%s/cache=%v", tok.Name(), cached), func(b *testing.B) {
				pool := NewPool(tok, opts)
				ctx := context.Background()
				dst, _ := pool.Encode(ctx, prompts[0], nil) // the first sight fills the cache
				tokens := 0
				b.SetBytes(size)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					dst, _ = pool.Encode(ctx, prompts[i%len(prompts)], dst[:0])
					tokens += len(dst)
				}
				b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}
