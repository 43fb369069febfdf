package disk

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func BenchmarkZZPieces(b *testing.B) {
	const slots = 8
	fd, buf := openDirect(b, filepath.Join(b.TempDir(), "raw"), unix.O_CREAT), benchBuffer(b)
	for i := range slots {
		if err := pwritevFull(fd, [][]byte{buf}, int64(i)*benchChunk); err != nil {
			b.Fatal(err)
		}
	}
	unix.Fdatasync(fd)
	dst := mmapAligned(b, benchChunk)
	pieces := []int{32 << 20, 8 << 20, 4 << 20, 2 << 20, 1 << 20}
	tot := make([]time.Duration, len(pieces))
	b.SetBytes(benchChunk)
	i := 0
	for b.Loop() {
		for j, p := range pieces {
			off := int64(i%slots) * benchChunk
			s := time.Now()
			for q := 0; q < benchChunk; q += p {
				if err := preadFull(fd, dst[q:q+p], off+int64(q)); err != nil {
					b.Fatal(err)
				}
			}
			tot[j] += time.Since(s)
			i++
		}
	}
	for j, p := range pieces {
		b.ReportMetric(tot[j].Seconds()/tot[0].Seconds(), fmt.Sprintf("t%dM/t32M", p>>20))
	}
}
