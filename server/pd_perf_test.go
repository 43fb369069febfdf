package server_test

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"kvtier/client"
	"kvtier/server"
)

// Sizes of BenchmarkPushLarge: the transfer kvtier bench times.
const (
	largeChunks     = 16
	largeChunkBytes = 32 << 20
)

// BenchmarkPushLarge times the push of 16 chunks of 32 MiB between two
// daemons in this process, from PUSH until the consumer's WAIT for all of
// them returns, and reports it against a plain loopback TCP stream of the
// same bytes timed just before each push (ratio/stream: stream time over
// push time, summed over the iterations). The consumer's arena is warmed
// first, as kvtier bench prefaults it. Profile the push path alone with:
//
//	go test -run '^$' -bench PushLarge -benchtime 20x -cpuprofile /tmp/pd.prof ./server
func BenchmarkPushLarge(b *testing.B) {
	total := int64(largeChunks * largeChunkBytes)
	prod := startService(b, total+largeChunkBytes, server.ServiceOptions{})
	cons := startService(b, 2*total+largeChunkBytes, server.ServiceOptions{PDReceiveBytes: total})
	pc, cc := prod.local(b), cons.remote(b)
	keys := pdKeys(largeChunks, 40)
	storeRaw(b, prod.remote(b), keys, 41, largeChunkBytes)
	ctx := context.Background()
	dst := make([][]byte, largeChunks)
	for j := range dst {
		dst[j] = make([]byte, largeChunkBytes)
	}
	stream := benchStream(b, largeChunks, largeChunkBytes)
	var streamNS, pushNS float64
	b.SetBytes(total)
	b.ReportAllocs()
	id := uint64(0)
	once := func() {
		b.StopTimer()
		streamNS += stream()
		b.StartTimer()
		start := nanotime()
		id++
		if _, err := pc.Push(ctx, id, cons.tcp, client.Raw(keys), 0, true); err != nil {
			b.Fatal(err)
		}
		if w, err := cc.Wait(ctx, client.Raw(keys), 0, 60000); err != nil || int(w.Chunks) != len(keys) {
			st, serr := pc.PushStatus(ctx, id)
			b.Fatalf("wait: %+v %v; transfer %+v %v", w, err, st, serr)
		}
		pushNS += float64(nanotime() - start)
		b.StopTimer()
		// Reading the chunks ends their holds, returning the receive
		// budget; clearing them makes the next push store them again.
		if n, _, err := cc.Retrieve(ctx, client.Raw(keys), dst); err != nil || n != len(keys) {
			b.Fatalf("retrieve: %d %v", n, err)
		}
		cons.eng.Clear(keys[0].Scope)
		b.StartTimer()
	}
	for range 3 { // fault in the consumer's arena, pool the connection
		once()
	}
	streamNS, pushNS = 0, 0
	b.ResetTimer()
	for b.Loop() {
		once()
	}
	b.ReportMetric(streamNS/pushNS, "ratio/stream")
}

// benchStream returns a function timing, in ns, one plain loopback TCP
// stream of n chunks of size bytes, each read with one ReadFull, on a
// connection kept for the benchmark.
func benchStream(b *testing.B, n, size int) func() float64 {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	src, dst := make([]byte, size), make([][]byte, n)
	for j := range dst {
		dst[j] = make([]byte, size)
	}
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		for {
			for _, d := range dst {
				if _, err := io.ReadFull(conn, d); err != nil {
					return
				}
			}
			if _, err := conn.Write([]byte{1}); err != nil {
				return
			}
		}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	var ack [1]byte
	return func() float64 {
		start := nanotime()
		for range n {
			if _, err := conn.Write(src); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := io.ReadFull(conn, ack[:]); err != nil {
			b.Fatal(err)
		}
		return float64(nanotime() - start)
	}
}

func nanotime() int64 { return time.Now().UnixNano() }
