package server_test

import (
	"context"
	"runtime"
	"testing"

	"kvtier/client"
	"kvtier/server"
	"kvtier/wire"
)

// BenchmarkLookupLocal measures LOOKUP round trips of a cached 4,096-token
// prompt over the local socket from parallel clients (-cpu sets how many
// goroutines per core; each has its own connection).
func BenchmarkLookupLocal(b *testing.B) { benchLookups(b, 1) }

// BenchmarkLookupBatchLocal is BenchmarkLookupLocal with 16 lookups per
// LOOKUP_BATCH; one op is one lookup.
func BenchmarkLookupBatchLocal(b *testing.B) { benchLookups(b, 16) }

func benchLookups(b *testing.B, batch int) {
	d := startService(b, 64<<20, server.ServiceOptions{})
	setup := d.local(b)
	h, _ := setup.Scope(context.Background(), pScope)
	tokens := prompt(4096, 3)
	n := 4096 / pChunkTokens
	small := make([][]byte, n)
	for i := range small {
		small[i] = make([]byte, 64)
	}
	if got, err := setup.Store(context.Background(), client.Tokens(h, tokens, 0), small); got != n || err != nil {
		b.Fatal(got, err)
	}
	// One connection per RunParallel goroutine (SetParallelism(2) makes
	// 2×GOMAXPROCS), dialled here: b.Fatal, which d.local calls, must not
	// run on RunParallel's goroutines.
	conns := make(chan *client.Client, 2*runtime.GOMAXPROCS(0))
	for range cap(conns) {
		conns <- d.local(b)
	}
	b.ReportAllocs()
	b.SetParallelism(2)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := <-conns
		ctx := context.Background()
		hc, _ := c.Scope(ctx, pScope)
		keys := client.Tokens(hc, tokens, 0)
		lookups := make([]wire.Lookup, batch)
		for i := range lookups {
			lookups[i].Keys = keys
		}
		for {
			// pb.Next counts one lookup: a batch takes batch of them.
			k := 0
			for k < batch && pb.Next() {
				k++
			}
			if k == 0 {
				return
			}
			if batch == 1 {
				if hit, err := c.Lookup(ctx, keys, 0); err != nil || int(hit.Chunks) != n {
					b.Error(hit, err)
					return
				}
				continue
			}
			res, err := c.LookupBatch(ctx, lookups[:k])
			if err != nil || int(res[0].Reply.Chunks) != n {
				b.Error(res, err)
				return
			}
		}
	})
}
