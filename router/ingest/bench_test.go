package ingest

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"kvtier/router/index"
)

const (
	benchEvents = 64 // BlockStored events per batch, as after a busy scheduler step
	benchBlocks = 16 // blocks per event
)

// benchPayloads builds n EventBatches of 64 BlockStored events of 16 random
// block hashes (with 16 token ids per block), in vLLM's tagged encoding.
func benchPayloads(b *testing.B, n int) [][]byte {
	rng := rand.New(rand.NewPCG(7, 8))
	out := make([][]byte, n)
	for i := range out {
		events := make([]any, benchEvents)
		for j := range events {
			hashes := make([]uint64, benchBlocks)
			for k := range hashes {
				hashes[k] = rng.Uint64()
			}
			tokens := make([]uint32, benchBlocks*16)
			for k := range tokens {
				tokens[k] = rng.Uint32N(150000)
			}
			events[j] = []any{"BlockStored", hashes, rng.Uint64(), tokens, 16, nil, "GPU", nil, nil, 0}
		}
		out[i] = batch(b, tagged, events...)
	}
	return out
}

// BenchmarkApply measures the per-message path without sockets: frame
// checks, topic lookup, sequence tracking, msgpack decoding and Index.Add.
//
//   - refresh: 16 batches cycled over a roomy index, so after the first
//     round every block is already held (the engine re-announcing blocks);
//   - churn: 512 batches (524,288 distinct blocks) cycled over an index
//     bounded at 262,144 blocks, so in steady state every add inserts a new
//     block and evicts an old one.
func BenchmarkApply(b *testing.B) {
	for _, c := range []struct {
		name      string
		payloads  int
		maxBlocks int
	}{
		{"refresh", 16, 1 << 20},
		{"churn", 512, 1 << 18},
	} {
		b.Run(c.name, func(b *testing.B) {
			payloads := benchPayloads(b, c.payloads)
			ix, err := index.New(index.Config{MaxBlocks: c.maxBlocks, Preallocate: true})
			if err != nil {
				b.Fatal(err)
			}
			s := newStream(ix, index.NewPods(), new(counterSet), "p", nil)
			fr := [][]byte{[]byte("kv@pod-0@org/model"), make([]byte, 8), nil}
			var seq uint64
			handle := func(i int) {
				binary.BigEndian.PutUint64(fr[1], seq)
				seq++
				fr[2] = payloads[i%len(payloads)]
				s.handle(fr)
			}
			for i := range payloads { // warm the index and the stream's buffers
				handle(i)
			}
			var size int64
			for _, p := range payloads {
				size += int64(len(p))
			}
			b.SetBytes(size / int64(len(payloads)))
			b.ReportAllocs()
			b.ResetTimer()
			i := 0
			for b.Loop() {
				handle(i)
				i++
			}
			b.ReportMetric(float64(i*benchEvents*benchBlocks)/b.Elapsed().Seconds(), "blocks/s")
			if st := s.counters.get("pod-0").snapshot(); st.Malformed != 0 || st.Gaps != 0 {
				b.Fatalf("stats %+v: benchmark input was not applied cleanly", st)
			}
			if evicted := ix.Stats().Evictions; (c.name == "churn") != (evicted > 0) {
				b.Fatalf("%s: %d evictions", c.name, evicted)
			}
		})
	}
}
