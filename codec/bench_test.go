package codec

import (
	"fmt"
	"sync"
	"testing"

	"kvtier/kvformat"
)

// benchTokens keeps the benchmark chunk at 32 MiB: Llama-3-8B without
// tensor parallelism (32 layers, 8 KV heads of 128) holds 128 KiB of
// 16-bit KV per token.
const benchTokens = 256

func benchSpec(d kvformat.DType) kvformat.Spec {
	return kvformat.Spec{Layers: 32, KVHeads: 8, HeadDim: 128, DType: d, Layout: kvformat.Layout2LTD, ChunkTokens: benchTokens}
}

// benchData builds each dtype's synthetic chunk once per test binary: at
// 16M Gaussian samples it takes longer than a benchmark round.
var benchData = sync.OnceValue(func() map[kvformat.DType][]byte {
	m := map[kvformat.DType][]byte{}
	for _, d := range []kvformat.DType{kvformat.Float16, kvformat.BFloat16} {
		m[d] = SyntheticKV(benchSpec(d), benchTokens, 1)
	}
	return m
})

// BenchmarkMemcpy is the baseline the codec figures should be read
// against: copying the chunk once on this machine.
func BenchmarkMemcpy(b *testing.B) {
	src := benchData()[kvformat.Float16]
	dst := make([]byte, len(src))
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		copy(dst, src)
	}
}

// BenchmarkSeal and BenchmarkUnseal report throughput in raw chunk bytes
// (SetBytes), plus the compression ratio and, for lossy codecs, the error
// as extra metrics.
func BenchmarkSeal(b *testing.B) {
	forEachBench(b, func(b *testing.B, c Codec, spec kvformat.Spec, data []byte) {
		obj, err := Seal(nil, c, spec, data)
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			obj, _ = Seal(obj[:0], c, spec, data)
		}
		// After the loop: b.Loop's first call drops earlier metrics.
		reportQuality(b, c, spec, data, obj)
	})
}

func BenchmarkUnseal(b *testing.B) {
	forEachBench(b, func(b *testing.B, c Codec, spec kvformat.Spec, data []byte) {
		obj, err := Seal(nil, c, spec, data)
		if err != nil {
			b.Fatal(err)
		}
		back := make([]byte, 0, len(data))
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, _, err := Unseal(back, obj); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func forEachBench(b *testing.B, run func(*testing.B, Codec, kvformat.Spec, []byte)) {
	for _, c := range allCodecs(b) {
		for _, d := range []kvformat.DType{kvformat.Float16, kvformat.BFloat16} {
			b.Run(fmt.Sprintf("%s/%s", c.Name(), d), func(b *testing.B) {
				b.ReportAllocs()
				run(b, c, benchSpec(d), benchData()[d])
			})
		}
	}
}

func reportQuality(b *testing.B, c Codec, spec kvformat.Spec, data, obj []byte) {
	b.ReportMetric(float64(len(data))/float64(len(obj)), "ratio")
	if c.Lossless() {
		return
	}
	back, _, err := Unseal(nil, obj)
	if err != nil {
		b.Fatal(err)
	}
	r := Report{Codec: c.Name()}
	if err := r.addErrors(spec, data, back); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.MaxRelErr, "max-err")
	b.ReportMetric(r.MeanRelErr, "mean-err")
	b.ReportMetric(r.RMSRelErr, "rms-err")
}
