package tier_test

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
	"kvtier/tier/mem"
)

// benchGeo is the harness benchmark's shape (docs/layerwise.md): 32 layers,
// K and V, chunks of 16 MiB, four of them.
var benchGeo = tier.LayerGeometry{Layers: 32, Parts: 2}

const (
	benchChunk  = 16 << 20
	benchChunks = 4
)

// BenchmarkStreamDisk reads a prefix of four 16 MiB chunks from a real disk
// tier into RAM, whole (Acquire, as PREPARE_RETRIEVE) and layer by layer
// (AcquireStream, then Wait for every layer in order, as the connector's
// LAYER_WAITs do), and reports the process's CPU time per prefix (user and
// system, all threads, getrusage) beside the wall time, so the CPU the
// layered read adds can be compared with the whole read's in one run.
func BenchmarkStreamDisk(b *testing.B) {
	ram, arenaMem := benchRAM(b)
	d := newDisk(&testing.T{}, b.TempDir(), 4*benchChunks*benchChunk)
	b.Cleanup(func() { d.Close() })
	keys := make([]chunk.Key, benchChunks)
	for i := range keys {
		keys[i] = key(i)
		if err := d.Put(context.Background(), keys[i], payload(i, benchChunk)); err != nil {
			b.Fatal(err)
		}
	}
	m, err := tier.NewManager(ram, []tier.Tier{d}, tier.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	ids := make([]arena.ID, benchChunks)
	geo := func() tier.LayerGeometry { return benchGeo }
	run := func(b *testing.B, read func()) {
		read() // the arena's pages are committed by the first read, as in a daemon that has served a while
		evict(ram, keys, arenaMem, ids)
		var u0 syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &u0)
		b.ReportAllocs()
		b.SetBytes(benchChunks * benchChunk)
		b.ResetTimer()
		for range b.N {
			read()
			b.StopTimer()
			evict(ram, keys, arenaMem, ids)
			b.StartTimer()
		}
		b.StopTimer()
		var u1 syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &u1)
		cpu := time.Duration(u1.Utime.Nano() + u1.Stime.Nano() - u0.Utime.Nano() - u0.Stime.Nano())
		b.ReportMetric(float64(cpu.Microseconds())/1e3/float64(b.N), "cpu-ms/op")
	}
	b.Run("whole", func(b *testing.B) {
		run(b, func() {
			if n, err := m.Acquire(context.Background(), keys, ids); n != benchChunks || err != nil {
				b.Fatalf("acquired %d chunks: %v", n, err)
			}
		})
	})
	b.Run("layers", func(b *testing.B) {
		run(b, func() {
			n, s, err := m.AcquireStream(context.Background(), keys, ids, geo, time.Now().Add(time.Minute))
			if n != benchChunks || s == nil || err != nil {
				b.Fatalf("acquired %d chunks, stream %v: %v", n, s != nil, err)
			}
			for layer := 0; layer < benchGeo.Layers; {
				usable, ready, err := s.Wait(context.Background(), layer)
				if usable != benchChunks || err != nil {
					b.Fatalf("layer %d: %d usable: %v", layer, usable, err)
				}
				layer = ready
			}
			// Past the last layer, Wait returns once the stream has committed its chunks.
			if _, _, err := s.Wait(context.Background(), benchGeo.Layers); err != nil || !s.Done() {
				b.Fatalf("stream not over: %v", err)
			}
		})
	})
}

// benchRAM is a RAM tier with room for the prefix twice over.
func benchRAM(b *testing.B) (*mem.Tier, *arena.Arena) {
	a, err := arena.New(arena.Options{Capacity: 2 * benchChunks * benchChunk})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.Close() })
	r, err := mem.New(a, "LRU")
	if err != nil {
		b.Fatal(err)
	}
	return r, a
}

// evict drops the acquire's references and the chunks from RAM, leaving
// them on disk only.
func evict(ram *mem.Tier, keys []chunk.Key, a *arena.Arena, ids []arena.ID) {
	for i, id := range ids {
		if id != 0 {
			a.Unref(id)
			ids[i] = 0
		}
	}
	for _, k := range keys {
		ram.Remove(k)
	}
}

// BenchmarkStreamLayerCount reads 32 chunks of 256 KiB from a real disk
// tier layer by layer, stated as 8 layers and as 32,768 (4-byte spans),
// waiting for each layer in order as the connector does, and reports the
// process's CPU time per prefix: what a geometry of many tiny layers
// costs the daemon beyond the I/O.
func BenchmarkStreamLayerCount(b *testing.B) {
	const chunks, size = 32, 256 << 10
	a, err := arena.New(arena.Options{Capacity: 4 * chunks * size})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.Close() })
	ram, err := mem.New(a, "LRU")
	if err != nil {
		b.Fatal(err)
	}
	d := newDisk(&testing.T{}, b.TempDir(), 4*chunks*size)
	b.Cleanup(func() { d.Close() })
	keys := make([]chunk.Key, chunks)
	for i := range keys {
		keys[i] = key(i)
		if err := d.Put(context.Background(), keys[i], payload(i, size)); err != nil {
			b.Fatal(err)
		}
	}
	m, err := tier.NewManager(ram, []tier.Tier{d}, tier.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	ids := make([]arena.ID, chunks)
	for _, layers := range []int{8, 32768} {
		geo := tier.LayerGeometry{Layers: layers, Parts: 2}
		b.Run(strconv.Itoa(layers), func(b *testing.B) {
			var u0 syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &u0)
			for b.Loop() {
				n, s, err := m.AcquireStreamExact(context.Background(), keys, ids, geo, time.Now().Add(time.Minute))
				if n != chunks || s == nil || err != nil {
					b.Fatalf("acquired %d chunks, stream %v: %v", n, s != nil, err)
				}
				for layer := 0; layer < layers; {
					_, ready, err := s.Wait(context.Background(), layer)
					if err != nil {
						b.Fatal(err)
					}
					layer = ready
				}
				s.Wait(context.Background(), layers)
				evict(ram, keys, a, ids)
			}
			var u1 syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &u1)
			cpu := time.Duration(u1.Utime.Nano() + u1.Stime.Nano() - u0.Utime.Nano() - u0.Stime.Nano())
			b.ReportMetric(float64(cpu.Microseconds())/1e3/float64(b.N), "cpu-ms/op")
		})
	}
}
