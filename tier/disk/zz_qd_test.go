package disk

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func BenchmarkZZQD(b *testing.B) {
	const slots = 8
	fd, buf := openDirect(b, filepath.Join(b.TempDir(), "raw"), unix.O_CREAT), benchBuffer(b)
	for i := range slots {
		if err := pwritevFull(fd, [][]byte{buf}, int64(i)*benchChunk); err != nil {
			b.Fatal(err)
		}
	}
	unix.Fdatasync(fd)
	dst := mmapAligned(b, benchChunk)
	type cfg struct{ piece, par int }
	cfgs := []cfg{{32 << 20, 1}, {4 << 20, 1}, {8 << 20, 1}, {4 << 20, 2}, {8 << 20, 2}, {4 << 20, 4}, {4 << 20, 8}, {2 << 20, 4}, {16 << 20, 1}}
	tot := make([]time.Duration, len(cfgs))
	i := 0
	for b.Loop() {
		for k := range cfgs {
			j := (k + i) % len(cfgs)
			c := cfgs[j]
			off := int64(i%slots) * benchChunk
			s := time.Now()
			var wg sync.WaitGroup
			for g := range c.par {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for q := g * c.piece; q < benchChunk; q += c.par * c.piece {
						if err := preadFull(fd, dst[q:q+c.piece], off+int64(q)); err != nil {
							panic(err)
						}
					}
				}()
			}
			wg.Wait()
			tot[j] += time.Since(s)
		}
		i++
	}
	for j, c := range cfgs {
		b.ReportMetric(tot[0].Seconds()/tot[j].Seconds(), fmt.Sprintf("x%dMx%d", c.piece>>20, c.par))
	}
	b.ReportMetric(float64(i)*benchChunk/tot[0].Seconds()/1e6, "raw-MB/s")
}
