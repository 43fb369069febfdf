package disk

import (
	"context"
	"fmt"
	"testing"
	"time"
)

func BenchmarkZZSplit(b *testing.B) {
	dir := b.TempDir()
	buf := benchBuffer(b)
	d := openTier(b, dir, Options{Capacity: 8 * recordSize(benchChunk)})
	defer d.Close()
	const keys = 4
	ctx := context.Background()
	for i := range uint64(keys) {
		if err := d.Put(ctx, testKey(i), buf); err != nil {
			b.Fatal(err)
		}
	}
	type place struct {
		fd  int
		off int64
	}
	var raw [keys]place
	for i := range raw {
		path, off := location(b, d, testKey(uint64(i)))
		raw[i] = place{openDirect(b, path, 0), off}
	}
	dst := mmapAligned(b, benchChunk)
	w := newWorker(1 << 20)
	p := newProgress()
	names := []string{"raw", "get", "readRecord", "raw4M"}
	var tot [4]time.Duration
	n := 0
	for b.Loop() {
		i := n % keys
		fs := []func() error{
			func() error { return preadFull(raw[i].fd, dst, raw[i].off+blockSize) },
			func() error { _, err := d.Get(ctx, testKey(uint64(i)), dst); return err },
			func() error { p.reset(); return w.readRecord(raw[i].fd, true, raw[i].off, dst, p) },
			func() error {
				for q := 0; q < benchChunk; q += readPiece {
					if err := preadFull(raw[i].fd, dst[q:q+readPiece], raw[i].off+blockSize+int64(q)); err != nil {
						return err
					}
				}
				return nil
			},
		}
		for k := range fs {
			j := (k + n) % len(fs)
			s := time.Now()
			if err := fs[j](); err != nil {
				b.Fatal(err)
			}
			tot[j] += time.Since(s)
		}
		n++
	}
	for j := range names {
		b.ReportMetric(tot[0].Seconds()/tot[j].Seconds(), fmt.Sprintf("x-%s", names[j]))
	}
	b.ReportMetric(float64(n)*benchChunk/tot[0].Seconds()/1e6, "raw-MB/s")
}
