package redis

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/chunk"
	"kvtier/tier"
)

// The benchmarks pair each tier operation with the same operation done by
// plain go-redis on the same server in the same run, so the ratio holds
// on a noisy machine. Run with -benchmem.

const benchSize = 32 << 20

// benchClients opens the tier and a plain client with the tier's options.
func benchClients(b *testing.B) (*Tier, goredis.UniversalClient) {
	srv := sharedServer(b)
	tr := openTier(b, srv.url(""))
	cfg, err := parseURL(mustParse(b, srv.url("")))
	if err != nil {
		b.Fatal(err)
	}
	raw := goredis.NewUniversalClient(clientOptions(cfg, 10*time.Second))
	b.Cleanup(func() { raw.Close() })
	return tr, raw
}

func BenchmarkPut32MiB(b *testing.B) {
	tr, raw := benchClients(b)
	ctx := context.Background()
	data := payload(benchSize, 1)
	k := testKey(uniqueScope(), 0)
	b.Run("tier", func(b *testing.B) {
		b.SetBytes(benchSize)
		for b.Loop() {
			b.StopTimer()
			tr.Remove(k) // so that each Put really stores
			b.StartTimer()
			if err := tr.Put(ctx, k, data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("raw-set", func(b *testing.B) {
		b.SetBytes(benchSize)
		name := tr.keyName(k) + "-raw"
		for b.Loop() {
			b.StopTimer()
			raw.Del(ctx, name)
			b.StartTimer()
			if err := raw.Set(ctx, name, data, 0).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkGet32MiB(b *testing.B) {
	tr, raw := benchClients(b)
	ctx := context.Background()
	data := payload(benchSize, 2)
	k := testKey(uniqueScope(), 0)
	if err := tr.Put(ctx, k, data); err != nil {
		b.Fatal(err)
	}
	dst := make([]byte, benchSize)
	b.Run("tier", func(b *testing.B) {
		b.SetBytes(benchSize)
		for b.Loop() {
			if n, err := tr.Get(ctx, k, dst); err != nil || n != benchSize {
				b.Fatal(n, err)
			}
		}
	})
	b.Run("raw-get", func(b *testing.B) {
		b.SetBytes(benchSize)
		for b.Loop() {
			got, err := raw.Get(ctx, tr.keyName(k)).Bytes()
			if err != nil || len(got) != benchSize {
				b.Fatal(len(got), err)
			}
		}
	})
}

// BenchmarkGetSmall shows the per-call overhead, allocations included, on
// a 64 KiB object.
func BenchmarkGetSmall(b *testing.B) {
	tr, _ := benchClients(b)
	ctx := context.Background()
	k := testKey(uniqueScope(), 0)
	if err := tr.Put(ctx, k, payload(64<<10, 3)); err != nil {
		b.Fatal(err)
	}
	dst := make([]byte, 64<<10)
	b.SetBytes(64 << 10)
	for b.Loop() {
		if _, err := tr.Get(ctx, k, dst); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPrefixContains64 is one lookup of a 64-chunk prompt.
func BenchmarkPrefixContains64(b *testing.B) {
	tr, _ := benchClients(b)
	ctx := context.Background()
	keys := make([]chunk.Key, 64)
	scope := uniqueScope()
	for i := range keys {
		keys[i] = testKey(scope, i)
		if err := tr.Put(ctx, keys[i], []byte("x")); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		if n := tr.PrefixContains(keys); n != len(keys) {
			b.Fatal(n)
		}
	}
}

// BenchmarkContainsCached is the manager's presence check and Size before
// a Get, answered from the presence cache; BenchmarkContainsUncached is the
// same without the cache (cache=0), which is what the cache saves.
func BenchmarkContainsCached(b *testing.B) {
	tr, _ := benchClients(b)
	benchPresence(b, tr)
}

func BenchmarkContainsUncached(b *testing.B) {
	benchPresence(b, openTier(b, sharedServer(b).url("cache=0")))
}

func benchPresence(b *testing.B, tr *Tier) {
	k := testKey(uniqueScope(), 0)
	if err := tr.Put(context.Background(), k, []byte("x")); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if !tier.Contains(tr, k) {
			b.Fatal("lost")
		}
		if _, ok := tr.Size(k); !ok {
			b.Fatal("lost")
		}
	}
}

func TestRawBaseline(t *testing.T) {
	srv := sharedServer(t)
	data := payload(1<<20, 4)
	b, err := RawBaseline(context.Background(), mustParse(t, srv.url("")), data, 3)
	if err != nil {
		t.Fatal(err)
	}
	if b.N != 3 || b.Bytes != len(data) || b.Set <= 0 || b.Get <= 0 {
		t.Fatalf("baseline %+v", b)
	}
	if n, _ := srv.rawClient().Exists(context.Background(), DefaultPrefix+"baseline-scratch").Result(); n != 0 {
		t.Fatal("baseline left its scratch key behind")
	}
}

// BenchmarkVersusRaw32MiB interleaves the tier's Put and Get with plain
// go-redis SET and GET of the same bytes, one of each per iteration, so
// both see the same machine load, and reports each rate and the ratios.
func BenchmarkVersusRaw32MiB(b *testing.B) {
	tr, raw := benchClients(b)
	ctx := context.Background()
	data := payload(benchSize, 5)
	k := testKey(uniqueScope(), 0)
	rawName := tr.keyName(k) + "-raw"
	dst := make([]byte, benchSize)
	var put, set, get, rawGet time.Duration
	timed := func(d *time.Duration, f func() error) {
		start := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		*d += time.Since(start)
	}
	tierPut := func() { timed(&put, func() error { return tr.Put(ctx, k, data) }) }
	rawSet := func() { timed(&set, func() error { return raw.Set(ctx, rawName, data, 0).Err() }) }
	tierGet := func() { timed(&get, func() error { _, err := tr.Get(ctx, k, dst); return err }) }
	rawGetOne := func() { timed(&rawGet, func() error { _, err := raw.Get(ctx, rawName).Bytes(); return err }) }
	for i := 0; b.Loop(); i++ {
		tr.Remove(k)
		raw.Del(ctx, rawName)
		// Whichever write follows the deletes pays for the server taking
		// memory back, so the two take turns going first.
		if i%2 == 0 {
			tierPut()
			rawSet()
			tierGet()
			rawGetOne()
		} else {
			rawSet()
			tierPut()
			rawGetOne()
			tierGet()
		}
	}
	rate := func(d time.Duration) float64 { return float64(b.N) * benchSize / d.Seconds() / 1e9 }
	b.ReportMetric(rate(put), "put-GB/s")
	b.ReportMetric(rate(set), "rawset-GB/s")
	b.ReportMetric(rate(get), "get-GB/s")
	b.ReportMetric(rate(rawGet), "rawget-GB/s")
	b.ReportMetric(set.Seconds()/put.Seconds(), "put/raw")
	b.ReportMetric(rawGet.Seconds()/get.Seconds(), "get/raw")
	b.ReportMetric(0, "ns/op") // the mix of four operations has no meaning
}
