package kvevents

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

const (
	benchEvents    = 64
	benchBlocks    = 16 // block hashes per BlockStored
	benchBlockSize = 16 // tokens per block
)

// typicalBatch builds 64 BlockStored events of 16 blocks each (with their
// 256 token ids), with random 64-bit hashes and token ids below 150,000, as
// vLLM publishes after a busy scheduler step.
func typicalBatch(mapForm bool) any {
	rng := rand.New(rand.NewPCG(1, 2))
	events := make([]any, benchEvents)
	for i := range events {
		hashes := make([]uint64, benchBlocks)
		for j := range hashes {
			hashes[j] = rng.Uint64()
		}
		tokens := make([]uint32, benchBlocks*benchBlockSize)
		for j := range tokens {
			tokens[j] = rng.Uint32N(150000)
		}
		parent := rng.Uint64()
		if mapForm {
			events[i] = omap{{"type", "BlockStored"}, {"block_hashes", hashes}, {"parent_block_hash", parent},
				{"token_ids", tokens}, {"block_size", benchBlockSize}, {"lora_id", nil}, {"medium", "GPU"},
				{"lora_name", nil}, {"group_idx", 0}}
		} else {
			events[i] = []any{"BlockStored", hashes, parent, tokens, benchBlockSize, nil, "GPU", nil, nil, 0}
		}
	}
	if mapForm {
		return omap{{"ts", 1700000000.0}, {"events", events}, {"data_parallel_rank", 0}}
	}
	return []any{1700000000.0, events, 0}
}

func BenchmarkDecode(b *testing.B) {
	for _, form := range []struct {
		name    string
		mapForm bool
	}{{"array", false}, {"map", true}} {
		b.Run(form.name, func(b *testing.B) {
			payload := pack(b, true, typicalBatch(form.mapForm))
			var d Decoder
			var batch Batch
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			for b.Loop() {
				if err := d.Decode(payload, &batch); err != nil {
					b.Fatal(err)
				}
			}
			if len(batch.Hashes) != benchEvents*benchBlocks {
				b.Fatalf("decoded %d hashes", len(batch.Hashes))
			}
			b.ReportMetric(float64(b.N)*benchEvents*benchBlocks/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

// The hand-written reader against vmihailenco/msgpack's low-level Decoder on
// the innermost loop: an array of 1024 full-width uint64 hashes.
func BenchmarkHashArray(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	hashes := make([]uint64, 1024)
	for i := range hashes {
		hashes[i] = rng.Uint64() | 1<<63
	}
	payload := pack(b, true, hashes)
	out := make([]uint64, 0, len(hashes))

	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r := reader{b: payload}
			n, err := r.arrayLen()
			if err != nil {
				b.Fatal(err)
			}
			out = out[:0]
			for range n {
				h, _, err := r.integer()
				if err != nil {
					b.Fatal(err)
				}
				out = append(out, h)
			}
		}
		b.ReportMetric(float64(b.N)*float64(len(hashes))/b.Elapsed().Seconds(), "hashes/s")
	})
	b.Run("vmihailenco", func(b *testing.B) {
		br := bytes.NewReader(payload)
		dec := msgpack.NewDecoder(br)
		b.ReportAllocs()
		for b.Loop() {
			br.Reset(payload)
			dec.Reset(br)
			n, err := dec.DecodeArrayLen()
			if err != nil {
				b.Fatal(err)
			}
			out = out[:0]
			for range n {
				h, err := dec.DecodeUint64()
				if err != nil {
					b.Fatal(err)
				}
				out = append(out, h)
			}
		}
		b.ReportMetric(float64(b.N)*float64(len(hashes))/b.Elapsed().Seconds(), "hashes/s")
	})
}

// BenchmarkEncode writes the typical batch (64 BlockStored events of 16
// blocks and 256 tokens) in each encoding into a reused buffer; it must
// not allocate.
func BenchmarkEncode(b *testing.B) {
	var d Decoder
	var batch Batch
	if err := d.Decode(pack(b, true, typicalBatch(false)), &batch); err != nil {
		b.Fatal(err)
	}
	for _, enc := range encodings {
		b.Run(enc.String(), func(b *testing.B) {
			e := Encoder{Encoding: enc}
			buf := e.Append(nil, &batch)
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				buf = e.Append(buf[:0], &batch)
			}
		})
	}
}
