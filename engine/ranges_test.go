package engine_test

import (
	"bytes"
	"context"
	"testing"

	"kvtier/engine"
)

// TestRangeReadsFromDisk: a prefix of RAM, disk, disk, RAM chunks. Both
// disk chunks' ranges are read from the disk tier and they stay out of
// RAM; every range holds the stored bytes. Released, the same RangeReads
// serves again, and no scratch memory stays taken.
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
			for _, rg := range [][2]int{{0, 100}, {size / 2, size/2 + 5000}, {size - 7, size}, {9, 9}} {
				got, err := r.Range(ctx, j, rg[0], rg[1])
				if err != nil || !bytes.Equal(got, chunks[j][rg[0]:rg[1]]) {
					t.Fatalf("round %d chunk %d range %v: %v", round, j, rg, err)
				}
			}
		}
		if !r.Scratch() || e.RangeBuffersInUse() != 1 {
			t.Fatalf("round %d: scratch %v, %d requests holding some", round, r.Scratch(), e.RangeBuffersInUse())
		}
		r.Release()
		for _, j := range []int{1, 2} {
			if e.InRAM(keys[j]) {
				t.Fatalf("round %d: chunk %d, read by ranges, was promoted", round, j)
			}
		}
		if e.RangeBuffersInUse() != 0 || e.RangeScratchInUse() != 0 {
			t.Fatalf("round %d: scratch still in use after the release", round)
		}
	}
}

// TestRangeReadsScratchExhausted: with all the scratch memory held by
// requests' ranges (four, each its share), another request does not wait
// for some: it promotes its chunk whole instead, with the right bytes,
// while the others keep what they hold (and their chunk stays out of
// RAM). Released, it is free.
func TestRangeReadsScratchExhausted(t *testing.T) {
	e, keys, chunks := layeredFixture(t, "", 2)
	ctx := context.Background()
	held := make([]engine.RangeReads, engine.RangeScratchBytes/engine.RangeRequestScratchBytes)
	size := len(chunks[0])
	for i := range held {
		if n, err := e.AcquireRanges(ctx, keys[:1], true, &held[i]); n != 1 || err != nil {
			t.Fatal(n, err)
		}
		defer held[i].Release()
		for e.RangeScratchInUse() < (i+1)*engine.RangeRequestScratchBytes {
			before := e.RangeScratchInUse()
			got, err := held[i].Range(ctx, 0, 0, size)
			if err != nil || !bytes.Equal(got, chunks[0]) {
				t.Fatalf("request %d, with %d bytes held: %v", i, before, err)
			}
			if e.RangeScratchInUse() == before {
				t.Fatalf("request %d: a range read from disk took no scratch memory (%d bytes held)", i, before)
			}
		}
	}
	if e.RangeScratchInUse() != engine.RangeScratchBytes {
		t.Fatalf("%d bytes of scratch in use, want all %d", e.RangeScratchInUse(), engine.RangeScratchBytes)
	}
	var r engine.RangeReads
	if n, err := e.AcquireRanges(ctx, keys[1:2], true, &r); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	got, err := r.Range(ctx, 0, 0, len(chunks[1]))
	if err != nil || !bytes.Equal(got, chunks[1]) || r.Scratch() {
		t.Fatalf("the second request: %v, scratch %v", err, r.Scratch())
	}
	r.Release()
	if !e.InRAM(keys[1]) {
		t.Fatal("the second chunk, with no scratch memory free, was not promoted")
	}
	if e.InRAM(keys[0]) || e.RangeScratchInUse() != engine.RangeScratchBytes {
		t.Fatalf("the first requests lost their scratch memory or their chunk was promoted")
	}
	for i := range held {
		if !held[i].Scratch() {
			t.Fatalf("request %d holds no scratch memory", i)
		}
		held[i].Release()
	}
	if got := e.RangeScratchInUse(); got != 0 {
		t.Fatalf("%d bytes of scratch in use after every release", got)
	}
}

// TestRangeReadsRequestShare: one request reading ranges of disk-only
// chunks takes at most RangeRequestScratchBytes of scratch memory; past
// it, its chunk is promoted and served from RAM, with the right bytes,
// and another request still finds scratch memory for its own ranges.
func TestRangeReadsRequestShare(t *testing.T) {
	e, keys, chunks := layeredFixture(t, "", 2)
	ctx := context.Background()
	var big engine.RangeReads
	if n, err := e.AcquireRanges(ctx, keys[:1], true, &big); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	defer big.Release()
	size := len(chunks[0])
	for !e.InRAM(keys[0]) {
		before := e.RangeScratchInUse()
		if before > engine.RangeRequestScratchBytes {
			t.Fatalf("one request holds %d bytes of scratch, more than its share of %d", before, engine.RangeRequestScratchBytes)
		}
		got, err := big.Range(ctx, 0, 0, size)
		if err != nil || !bytes.Equal(got, chunks[0]) {
			t.Fatalf("with %d bytes held: %v", before, err)
		}
	}
	if got := e.RangeScratchInUse(); got != engine.RangeRequestScratchBytes {
		t.Fatalf("the request holds %d bytes of scratch when its chunk is promoted, want its share of %d", got, engine.RangeRequestScratchBytes)
	}
	// From RAM now: no more scratch.
	if got, err := big.Range(ctx, 0, size/2, size); err != nil || !bytes.Equal(got, chunks[0][size/2:]) || e.RangeScratchInUse() != engine.RangeRequestScratchBytes {
		t.Fatalf("after the promotion: %v, %d bytes of scratch", err, e.RangeScratchInUse())
	}
	var other engine.RangeReads
	if n, err := e.AcquireRanges(ctx, keys[1:2], true, &other); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	got, err := other.Range(ctx, 0, 0, len(chunks[1]))
	if err != nil || !bytes.Equal(got, chunks[1]) || !other.Scratch() {
		t.Fatalf("another request: %v, scratch %v", err, other.Scratch())
	}
	other.Release()
	if e.InRAM(keys[1]) {
		t.Fatal("another request's chunk was promoted")
	}
	big.Release()
	if got := e.RangeScratchInUse(); got != 0 {
		t.Fatalf("%d bytes of scratch in use after every release", got)
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
