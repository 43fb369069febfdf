package bench

import (
	"context"
	"sync"
	"testing"

	"kvtier/engine"
	"kvtier/internal/proccpu"
	"kvtier/server"
)

// BenchmarkLookupRate runs one kind of the lookup-rate measurement alone,
// so that a profile shows that kind's costs only (kvtier bench
// --lookups-only --cpuprofile profiles all of them together): the empty
// round trip, the echo of a LOOKUP's bytes ("same"), PING through the
// daemon, LOOKUP with the tokens in the frame, with the request buffer,
// by engine hashes ("hashes") and by hashes the client computes on every
// call ("clienthash"), each from rateClients clients on their own connections; one op is one
// request, and cpu-ns/op is the CPU time of the whole process (clients,
// daemon, echo server) per request. For example:
//
//	go test -run X -bench 'LookupRate/buffer' -cpuprofile cpu.out ./bench
func BenchmarkLookupRate(b *testing.B) {
	ctx := context.Background()
	eng, err := engine.Open(engine.Options{ChunkSize: 256, RAMBytes: 64 << 20, Policy: "LRU"})
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	svc := server.NewService(eng, server.ServiceOptions{Token: benchToken})
	defer svc.Shutdown(context.Background())
	sock, cleanup, err := serveLocal(svc)
	if err != nil {
		b.Fatal(err)
	}
	defer cleanup()
	ps, err := storePrompts(ctx, sock)
	if err != nil {
		b.Fatal(err)
	}
	echoSrv, err := startEcho()
	if err != nil {
		b.Fatal(err)
	}
	sameReq, sameReply := lookupFrameLens(ps[0].tokens)
	defer echoSrv.Close()
	for _, k := range []struct {
		name string
		dial func() (rateClient, error)
	}{
		{"empty", func() (rateClient, error) { return dialEcho(echoSrv.Addr().String(), 0, 0) }},
		{"same", func() (rateClient, error) { return dialEcho(echoSrv.Addr().String(), sameReq, sameReply) }},
		{"ping", func() (rateClient, error) { return dialPing(ctx, sock) }},
		{"lookup", func() (rateClient, error) { return dialLookup(ctx, sock, ps, 1, 0) }},
		{"buffer", func() (rateClient, error) { return dialLookup(ctx, sock, ps, 1, rateBuffer) }},
		{"hashes", func() (rateClient, error) { return dialHashLookup(ctx, sock, ps, 1, false) }},
		{"clienthash", func() (rateClient, error) { return dialHashLookup(ctx, sock, ps, 1, true) }},
	} {
		b.Run(k.name, func(b *testing.B) {
			cs := make([]rateClient, rateClients)
			for i := range cs {
				if cs[i], err = k.dial(); err != nil {
					b.Fatal(err)
				}
				defer cs[i].Close()
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := proccpu.Used()
			var wg sync.WaitGroup
			for i, c := range cs {
				n := b.N / len(cs)
				if i == 0 {
					n += b.N % len(cs)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range n {
						if _, err := c.do(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			// CPU time moves far less than wall time on a loaded machine.
			b.ReportMetric(float64((proccpu.Used()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
