package disk

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Benchmarks move 32 MiB chunks between page-aligned memory outside the Go
// heap (as the shared arena hands them out) and a directory on a real disk,
// and report their rate as a ratio to raw O_DIRECT I/O of the same bytes in
// the same directory, measured right after ("x-raw").

const benchChunk = 32 << 20

func benchBuffer(b *testing.B) []byte {
	buf := mmapAligned(b, benchChunk)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(buf); i += 8 {
		v := r.Uint64()
		for j := range 8 {
			buf[i+j] = byte(v >> (8 * j))
		}
	}
	return buf
}

// reportVsRaw reports the benchmark's rate over the raw O_DIRECT rate.
func reportVsRaw(b *testing.B, dir string, buf []byte, elapsed time.Duration, n int, write bool) {
	b.Helper()
	rawW, rawR, err := RawDirectIO(dir, buf, 4)
	if err != nil {
		b.Fatal(err)
	}
	raw := rawR
	if write {
		raw = rawW
	}
	rate := float64(n) * float64(len(buf)) / elapsed.Seconds()
	b.ReportMetric(rate/raw, "x-raw")
	b.ReportMetric(raw/1e6, "raw-MB/s")
}

func BenchmarkPut(b *testing.B) {
	for _, c := range []struct {
		name string
		sync SyncMode
	}{{"sync-each", SyncEach}, {"sync-none", SyncNone}} {
		b.Run(c.name, func(b *testing.B) {
			dir := b.TempDir()
			buf := benchBuffer(b)
			d := openTier(b, dir, Options{Capacity: 8 * recordSize(benchChunk), Sync: c.sync})
			defer d.Close()
			if !d.DirectIO() {
				b.Logf("%s does not take O_DIRECT; measuring buffered I/O", dir)
			}
			ctx := context.Background()
			b.SetBytes(benchChunk)
			b.ReportAllocs()
			start := time.Now()
			i := uint64(0)
			for b.Loop() {
				if err := d.Put(ctx, testKey(i), buf); err != nil {
					b.Fatal(err)
				}
				i++
			}
			elapsed := time.Since(start)
			reportVsRaw(b, dir, buf, elapsed, int(i), true)
		})
	}
}

func BenchmarkGet(b *testing.B) {
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
	dst := mmapAligned(b, benchChunk)
	b.SetBytes(benchChunk)
	b.ReportAllocs()
	start := time.Now()
	i := uint64(0)
	for b.Loop() {
		if _, err := d.Get(ctx, testKey(i%keys), dst); err != nil {
			b.Fatal(err)
		}
		i++
	}
	elapsed := time.Since(start)
	reportVsRaw(b, dir, buf, elapsed, int(i), false)
}

// BenchmarkRawDirect is the baseline on its own: sequential O_DIRECT writes
// of the same 32 MiB to fresh space (one fdatasync at the end), and reads of
// them back.
func BenchmarkRawDirect(b *testing.B) {
	const slots = 8
	open := func(b *testing.B) int {
		fd, err := unix.Open(b.TempDir()+"/raw", unix.O_RDWR|unix.O_CREAT|unix.O_DIRECT|unix.O_CLOEXEC, 0o644)
		if err != nil {
			b.Skipf("O_DIRECT unavailable: %v", err)
		}
		b.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	b.Run("write", func(b *testing.B) {
		fd, buf := open(b), benchBuffer(b)
		b.SetBytes(benchChunk)
		i := 0
		for b.Loop() {
			if i%slots == 0 && i > 0 { // start over on freed space, as the tier appends to punched files
				b.StopTimer()
				unix.Ftruncate(fd, 0)
				b.StartTimer()
			}
			if err := pwritevFull(fd, [][]byte{buf}, int64(i%slots)*benchChunk); err != nil {
				b.Fatal(err)
			}
			i++
		}
		if err := unix.Fdatasync(fd); err != nil {
			b.Fatal(err)
		}
	})
	b.Run("read", func(b *testing.B) {
		fd, buf := open(b), benchBuffer(b)
		for i := range slots {
			if err := pwritevFull(fd, [][]byte{buf}, int64(i)*benchChunk); err != nil {
				b.Fatal(err)
			}
		}
		b.SetBytes(benchChunk)
		i := 0
		for b.Loop() {
			if err := preadFull(fd, buf, int64(i%slots)*benchChunk); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}
