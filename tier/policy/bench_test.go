package policy

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"kvtier/chunk"
)

const benchKeys = 1 << 16

func benchNew[K comparable](b *testing.B, name string) Policy[K] {
	p, err := New[K](name)
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkAccess measures a hit on a resident key.
func BenchmarkAccess(b *testing.B) {
	for _, name := range Names() {
		b.Run(name, func(b *testing.B) {
			p := benchNew[uint64](b, name)
			for k := range uint64(benchKeys) {
				p.Admit(k)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p.Access(uint64(i*7919) % benchKeys)
			}
		})
	}
}

// BenchmarkAdmitEvict measures a full cache taking a new key: one Evict
// and one Admit. The busy predicate pins the eight newest keys, like
// objects still being written.
func BenchmarkAdmitEvict(b *testing.B) {
	for _, name := range Names() {
		b.Run(name, func(b *testing.B) {
			p := benchNew[uint64](b, name)
			next := uint64(0)
			busy := func(k uint64) bool { return k+8 >= next }
			for ; next < benchKeys; next++ {
				p.Admit(next)
			}
			for ; next < 8*benchKeys; next++ { // warm up: ghosts fill, the index settles
				p.Evict(busy)
				p.Admit(next)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p.Evict(busy)
				p.Admit(next)
				next++
			}
		})
	}
}

// BenchmarkMixed replays a skewed key stream against a cache holding a
// quarter of the keys: hits on resident keys, evict-and-admit on misses.
// It exercises the ghost lists of S3-FIFO and ARC.
func BenchmarkMixed(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	z := rand.NewZipf(r, 1.1, 1, 4*benchKeys-1)
	stream := make([]uint64, 1<<20)
	for i := range stream {
		stream[i] = z.Uint64()
	}
	for _, name := range Names() {
		b.Run(name, func(b *testing.B) {
			p := benchNew[uint64](b, name)
			resident := make([]bool, 4*benchKeys)
			step := func(k uint64) {
				if resident[k] {
					p.Access(k)
					return
				}
				if p.Len() >= benchKeys {
					v, _ := p.Evict(nil)
					resident[v] = false
				}
				p.Admit(k)
				resident[k] = true
			}
			for _, k := range stream { // warm up: ghosts and buckets settle
				step(k)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				step(stream[i&(len(stream)-1)])
			}
		})
	}
}

// BenchmarkChunkKey is BenchmarkAdmitEvict with the RAM tier's key type.
func BenchmarkChunkKey(b *testing.B) {
	key := func(n uint64) chunk.Key {
		var k chunk.Key
		binary.LittleEndian.PutUint64(k.Hash[:], n*0x9E3779B97F4A7C15)
		return k
	}
	for _, name := range []string{LRU, S3FIFO} {
		b.Run(name, func(b *testing.B) {
			p := benchNew[chunk.Key](b, name)
			next := uint64(0)
			for ; next < benchKeys; next++ {
				p.Admit(key(next))
			}
			for ; next < 4*benchKeys; next++ {
				p.Evict(nil)
				p.Admit(key(next))
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p.Evict(nil)
				p.Admit(key(next))
				next++
			}
		})
	}
}

// BenchmarkChainAdmitEvict is BenchmarkAdmitEvict for the prefix-aware
// policies fed as the tiers feed them: prompts of 16 chunks, each chunk
// admitted as the child of the one before, the chain's head hit first.
func BenchmarkChainAdmitEvict(b *testing.B) {
	for _, name := range []string{TREELRU, TREELFU, TREEHD} {
		b.Run(name, func(b *testing.B) {
			p := benchNew[uint64](b, name).(Prefixed[uint64])
			next := uint64(0)
			step := func() {
				if p.Len() >= benchKeys {
					p.Evict(nil)
				}
				if next%16 == 0 {
					p.Admit(next)
				} else {
					p.Access(next - next%16)
					p.AdmitChild(next, next-1)
				}
				next++
			}
			for range 8 * benchKeys { // warm up: the ghost history fills
				step()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				step()
			}
		})
	}
}

// BenchmarkAdmitEvictSize is BenchmarkChainAdmitEvict at several cache
// sizes, with LRU as the baseline, to show whether an eviction's cost
// stays flat as the cache grows (random reads across a large cache miss
// the CPU caches; a policy whose victim choice reads many scattered slots
// slows down with size where a list head does not).
func BenchmarkAdmitEvictSize(b *testing.B) {
	for _, size := range []int{10_000, 100_000, 1_000_000} {
		for _, name := range []string{LRU, TREELRU, TREELFU, TREEHD} {
			b.Run(fmt.Sprintf("%s/%d", name, size), func(b *testing.B) {
				p := benchNew[uint64](b, name)
				next := uint64(0)
				step := func() {
					if p.Len() >= size {
						p.Evict(nil)
					}
					if next%16 == 0 {
						p.Admit(next)
					} else {
						p.Access(next - next%16)
						AdmitAfter(p, next, next-1, true)
					}
					next++
				}
				for range 5 * size { // warm up: the ghost history fills (4 per key)
					step()
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					step()
				}
			})
		}
	}
}
