package kvformat

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// The benchmarks move one Llama-3-8B chunk (llama3_8B: 256 tokens, 32 MiB)
// between a paged buffer of 16-token blocks and a chunk. The paged buffer
// holds four times the blocks the chunk needs and the chunk's blocks are
// picked in shuffled order, as a busy engine's block table would be; at
// 128 MiB per buffer nothing stays in the CPU caches between iterations.
//
// Every benchmark also reports x-memcpy: its time per operation divided by
// that of a plain copy() of the same number of bytes, run right after each
// operation with the benchmark timer stopped. Interleaving the two keeps the
// ratio fair while other load on the machine comes and goes.

const benchBlockSize = 16

type benchSetup struct {
	spec  Spec
	paged Paged
	slots []int64
	chunk []byte
}

func newBenchSetup(b *testing.B, kind PagedKind) benchSetup {
	b.Helper()
	spec := llama3_8B
	tokens := spec.ChunkTokens
	blocks := 4 * tokens / benchBlockSize
	paged := Paged{Kind: kind, BlockSize: benchBlockSize, Blocks: blocks, Layers: make([][]byte, spec.Layers)}
	for l := range paged.Layers {
		paged.Layers[l] = touched(2 * blocks * benchBlockSize * spec.RowBytes())
	}
	rng := rand.New(rand.NewPCG(42, 42))
	table := rng.Perm(blocks)
	slots := make([]int64, tokens)
	for i := range slots {
		slots[i] = int64(table[i/benchBlockSize]*benchBlockSize + i%benchBlockSize)
	}
	return benchSetup{spec: spec, paged: paged, slots: slots, chunk: touched(spec.ChunkBytes(tokens))}
}

// touched allocates n bytes and writes every page, so page faults are not
// part of any measurement.
func touched(n int) []byte {
	buf := make([]byte, n)
	for i := range buf {
		buf[i] = byte(i*31 + i>>12)
	}
	return buf
}

var copyBuffers = sync.OnceValues(func() ([]byte, []byte) {
	n := llama3_8B.ChunkBytes(llama3_8B.ChunkTokens)
	return touched(n), touched(n)
})

// loopVsCopy runs op under b.Loop, timing each call against a copy() of n
// bytes made right after it, and reports the ratio as x-memcpy. The copies
// walk through 32 MiB buffers so that, like op, they miss the caches.
func loopVsCopy(b *testing.B, n int, op func() error) {
	src, dst := copyBuffers()
	var opTime, copyTime time.Duration
	off := 0
	for b.Loop() {
		start := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		opTime += time.Since(start)

		b.StopTimer()
		if off+n > len(src) {
			off = 0
		}
		start = time.Now()
		copy(dst[off:off+n], src[off:off+n])
		copyTime += time.Since(start)
		off += n
		b.StartTimer()
	}
	b.ReportMetric(float64(opTime)/float64(copyTime), "x-memcpy")
}

func BenchmarkCopyBaseline(b *testing.B) {
	src, dst := copyBuffers()
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	for b.Loop() {
		copy(dst, src)
	}
}

func BenchmarkGather(b *testing.B) {
	for _, kind := range []PagedKind{PagedSplit, PagedBlockFirst} {
		b.Run(kind.String(), func(b *testing.B) {
			s := newBenchSetup(b, kind)
			b.SetBytes(int64(len(s.chunk)))
			b.ReportAllocs()
			loopVsCopy(b, len(s.chunk), func() error { return Gather(s.chunk, s.spec, s.paged, s.slots) })
		})
	}
}

func BenchmarkScatter(b *testing.B) {
	for _, kind := range []PagedKind{PagedSplit, PagedBlockFirst} {
		b.Run(kind.String(), func(b *testing.B) {
			s := newBenchSetup(b, kind)
			b.SetBytes(int64(len(s.chunk)))
			b.ReportAllocs()
			loopVsCopy(b, len(s.chunk), func() error { return Scatter(s.chunk, s.spec, s.paged, s.slots) })
		})
	}
}

// BenchmarkScatterLayer is the layerwise load step: one layer (1 MiB) of a
// chunk into the paged buffer.
func BenchmarkScatterLayer(b *testing.B) {
	s := newBenchSetup(b, PagedBlockFirst)
	layerBytes := len(s.chunk) / s.spec.Layers
	b.SetBytes(int64(layerBytes))
	b.ReportAllocs()
	layer := 0
	loopVsCopy(b, layerBytes, func() error {
		layer = (layer + 1) % s.spec.Layers
		return ScatterLayer(s.chunk, s.spec, s.paged, layer, s.slots)
	})
}
