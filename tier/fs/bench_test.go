package fs

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"kvtier/chunk"
	"kvtier/tier"
)

const benchSize = 4 << 20 // a typical chunk: 256 tokens of a 7B-class model's KV

// BenchmarkPutGet compares the tier with plain os.WriteFile / os.ReadFile of
// the same bytes in the same directory and run. Put pays for crash safety
// (fsync of file and directory, rename), so it is also compared with
// WriteFile followed by fsync. Each put creates its file anew and removes it
// right after, so no put finds the key already stored. os.ReadFile
// allocates its result each time; os.Open+ReadFull into the same buffer is
// the like-for-like baseline for Get.
func BenchmarkPutGet(b *testing.B) {
	tr := newTier(b, Config{Root: b.TempDir()})
	ctx := context.Background()
	data := randomBytes(benchSize, 1)
	dst := make([]byte, benchSize)
	plain := filepath.Join(tr.Dir(), "plain")

	b.Run("put/tier", func(b *testing.B) {
		b.SetBytes(benchSize)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			k := key(i % 4) // reuse fan-out directories, as a warm cache does
			if err := tr.Put(ctx, k, data); err != nil {
				b.Fatal(err)
			}
			tr.Remove(k)
			i++
		}
	})
	b.Run("put/os.WriteFile+fsync", func(b *testing.B) {
		b.SetBytes(benchSize)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			p := plain + strconv.Itoa(i)
			f, err := os.Create(p)
			if err != nil {
				b.Fatal(err)
			}
			if err := writeSyncClose(f, data); err != nil {
				b.Fatal(err)
			}
			os.Remove(p)
			i++
		}
	})
	b.Run("put/os.WriteFile", func(b *testing.B) {
		b.SetBytes(benchSize)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			p := plain + strconv.Itoa(i)
			if err := os.WriteFile(p, data, 0o644); err != nil {
				b.Fatal(err)
			}
			os.Remove(p)
			i++
		}
	})

	k := key(1)
	if err := tr.Put(ctx, k, data); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(plain, data, 0o644); err != nil {
		b.Fatal(err)
	}
	b.Run("get/tier", func(b *testing.B) {
		b.SetBytes(benchSize)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := tr.Get(ctx, k, dst); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("get/os.Open+ReadFull", func(b *testing.B) {
		b.SetBytes(benchSize)
		b.ReportAllocs()
		for b.Loop() {
			f, err := os.Open(plain)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(f, dst); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
	})
	b.Run("get/os.ReadFile", func(b *testing.B) {
		b.SetBytes(benchSize)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := os.ReadFile(plain); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkLookup(b *testing.B) {
	root := b.TempDir()
	tr := newTier(b, Config{Root: root})
	seq := newTier(b, Config{Root: root, Parallel: 1})
	keys := make([]chunk.Key, 64)
	for i := range keys {
		keys[i] = key(i)
		tr.Put(context.Background(), keys[i], []byte{1})
	}
	b.Run("contains", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			tier.Contains(tr, keys[0])
		}
	})
	b.Run("prefix64/parallel8", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if tr.PrefixContains(keys) != len(keys) {
				b.Fatal("prefix lost")
			}
		}
	})
	b.Run("prefix64/sequential", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if seq.PrefixContains(keys) != len(keys) {
				b.Fatal("prefix lost")
			}
		}
	})
}
