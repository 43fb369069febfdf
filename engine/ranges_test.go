package engine_test

import (
	"bytes"
	"context"
	"testing"

	"kvtier/engine"
)

// TestRangeReadsFromDisk: a prefix of RAM, disk, disk, RAM chunks. The
// first disk chunk's ranges are read from the disk tier and it stays out
// of RAM; the second is promoted whole, as Acquire does; every range
// holds the stored bytes. Released, the same RangeReads serves again.
func TestRangeReadsFromDisk(t *testing.T) {
	e, keys, chunks := layeredFixture(t, "", 4)
	ctx := context.Background()
	var rd engine.Reads
	for _, j := range []int{0, 3} { // back into RAM
		if n, err := e.Acquire(ctx, keys[j:j+1], &rd); n != 1 || err != nil {
			t.Fatal(n, err)
		}
		rd.Release()
	}
	var r engine.RangeReads
	for round := range 2 {
		n, err := e.AcquireRanges(ctx, keys, true, &r)
		if n != 4 || err != nil || r.Len() != 4 {
			t.Fatalf("round %d: AcquireRanges = %d, %v", round, n, err)
		}
		for j := range 4 {
			size := r.Size(j)
			if size != len(chunks[j]) {
				t.Fatalf("chunk %d: size %d, want %d", j, size, len(chunks[j]))
			}
			for _, rg := range [][2]int{{0, 100}, {size / 2, size/2 + 5000}, {size - 7, size}} {
				got, err := r.Range(ctx, j, rg[0], rg[1])
				if err != nil || !bytes.Equal(got, chunks[j][rg[0]:rg[1]]) {
					t.Fatalf("round %d chunk %d range %v: %v", round, j, rg, err)
				}
			}
		}
		r.Release()
		if e.InRAM(keys[1]) {
			t.Fatalf("round %d: chunk 1, read by ranges, was promoted", round)
		}
		if !e.InRAM(keys[2]) {
			t.Fatalf("round %d: chunk 2 was not promoted", round)
		}
		e.Manager().RAM().Remove(keys[2])
	}
}

// TestRangeReadsAllBuffersBusy: with every scratch buffer held, a fifth
// reader does not wait for one: it promotes the chunk whole instead, with
// the right bytes, while the four stay held. Released, they are free.
func TestRangeReadsAllBuffersBusy(t *testing.T) {
	e, keys, chunks := layeredFixture(t, "", 5)
	ctx := context.Background()
	held := make([]engine.RangeReads, 4)
	for i := range held {
		if n, err := e.AcquireRanges(ctx, keys[i:i+1], true, &held[i]); n != 1 || err != nil {
			t.Fatal(n, err)
		}
		defer held[i].Release()
	}
	if got := e.RangeBuffersInUse(); got != 4 {
		t.Fatalf("%d scratch buffers in use, want 4", got)
	}
	var r engine.RangeReads
	if n, err := e.AcquireRanges(ctx, keys[4:5], true, &r); n != 1 || err != nil || r.Scratch() {
		t.Fatal(n, err, r.Scratch())
	}
	got, err := r.Range(ctx, 0, 0, len(chunks[4]))
	if err != nil || !bytes.Equal(got, chunks[4]) {
		t.Fatalf("the fifth chunk: %v", err)
	}
	r.Release()
	if !e.InRAM(keys[4]) {
		t.Fatal("the fifth chunk, with no buffer free, was not promoted")
	}
	for i := range held {
		if e.InRAM(keys[i]) {
			t.Fatalf("chunk %d, read by ranges, was promoted", i)
		}
		if !held[i].Scratch() {
			t.Fatalf("reader %d holds no scratch buffer", i)
		}
	}
	if got := e.RangeBuffersInUse(); got != 4 {
		t.Fatalf("%d scratch buffers in use, want the 4 still held", got)
	}
	for i := range held {
		held[i].Release()
	}
	if got := e.RangeBuffersInUse(); got != 0 {
		t.Fatalf("%d scratch buffers in use after every release", got)
	}
}

// BenchmarkRangeReadsDisk serves one range of a chunk held on disk only,
// as RETRIEVE_RANGES does per layer (AcquireRanges, Range, Release), and
// the same range of the chunk in RAM, for -benchmem: the disk path pays
// the disk tier's read (and its per-open record), nothing per byte.
func BenchmarkRangeReadsDisk(b *testing.B) {
	for _, inRAM := range []bool{false, true} {
		name := "disk"
		if inRAM {
			name = "ram"
		}
		b.Run(name, func(b *testing.B) {
			e, keys, chunks := layeredFixture(b, "", 1)
			ctx := context.Background()
			if inRAM {
				var rd engine.Reads
				e.Acquire(ctx, keys, &rd)
				rd.Release()
			}
			size := len(chunks[0])
			var r engine.RangeReads
			b.SetBytes(int64(size / 8))
			b.ReportAllocs()
			for b.Loop() {
				if n, err := e.AcquireRanges(ctx, keys, true, &r); n != 1 || err != nil {
					b.Fatal(n, err)
				}
				if _, err := r.Range(ctx, 0, size/2, size/2+size/8); err != nil {
					b.Fatal(err)
				}
				r.Release()
			}
		})
	}
}
