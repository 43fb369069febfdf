package disk

import (
	"testing"

	"github.com/zeebo/xxh3"
)

func BenchmarkZZHash(b *testing.B) {
	buf := make([]byte, 32<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	want := xxh3.Hash(buf)
	b.Run("oneshot", func(b *testing.B) {
		b.SetBytes(int64(len(buf)))
		for b.Loop() {
			xxh3.Hash(buf)
		}
	})
	for _, piece := range []int{1 << 20, 4 << 20} {
		b.Run("hasher", func(b *testing.B) {
			var h xxh3.Hasher
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				h.Reset()
				for p := 0; p < len(buf); p += piece {
					h.Write(buf[p:min(p+piece, len(buf))])
				}
				if h.Sum64() != want {
					b.Fatal("mismatch")
				}
			}
		})
	}
}
