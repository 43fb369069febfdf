package s3

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"kvtier/chunk"
)

// The benchmarks compare the tier with plain minio-go calls moving the same
// 32 MiB against the same server in the same run, since absolute figures
// on a shared machine mean little. Run with:
//
//	go test -run '^$' -bench . -benchmem ./tier/s3/
const benchSize = 32 << 20

// benchServer keeps the gateway's files in RAM (/dev/shm) when there is
// room, so the figures measure the tier and the protocol rather than the
// writeback of a disk that other jobs on the machine share.
var benchServer struct {
	once sync.Once
	srv  *server
}

func startBenchServer(b *testing.B) *server {
	benchServer.once.Do(func() {
		parent := ""
		var st syscall.Statfs_t
		if syscall.Statfs("/dev/shm", &st) == nil && st.Bavail*uint64(st.Bsize) >= 1<<30 {
			parent = "/dev/shm"
		}
		benchServer.srv = newServerIn(b, parent)
	})
	if benchServer.srv == nil {
		b.Fatal("benchmark server failed to start")
	}
	return benchServer.srv
}

func benchTier(b *testing.B, srv *server) *Tier {
	cfg := srv.config(bucketName(b))
	cfg.Timeout = time.Minute
	return srv.openConfig(b, cfg)
}

func BenchmarkPut32MiB(b *testing.B) {
	srv := startBenchServer(b)
	data := payload(1, benchSize)
	ctx := context.Background()

	b.Run("tier", func(b *testing.B) {
		tr := benchTier(b, srv)
		b.SetBytes(benchSize)
		for i := 0; b.Loop(); i++ {
			k := chunk.Key{Scope: uint64(i)}
			if err := tr.Put(ctx, k, data); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			tr.Remove(k) // keep the disk from filling up
			b.StartTimer()
		}
	})
	rawPut := func(opts minio.PutObjectOptions) func(*testing.B) {
		return func(b *testing.B) {
			bucket := bucketName(b)
			benchTier(b, srv) // creates the bucket
			c := srv.rawClient(b)
			b.SetBytes(benchSize)
			for i := 0; b.Loop(); i++ {
				name := fmt.Sprintf("raw/%d", i)
				if _, err := c.PutObject(ctx, bucket, name, bytes.NewReader(data), benchSize, opts); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				c.RemoveObject(ctx, bucket, name, minio.RemoveObjectOptions{})
				b.StartTimer()
			}
		}
	}
	// minio-go's defaults: 16 MiB multipart parts and, over plain HTTP, a
	// SHA-256 signed stream.
	b.Run("minio-default", rawPut(minio.PutObjectOptions{}))
	// The request the tier sends: one unsigned PUT.
	b.Run("minio-single-unsigned", rawPut(putOptions))
}

func BenchmarkGet32MiB(b *testing.B) {
	srv := startBenchServer(b)
	ctx := context.Background()
	tr := benchTier(b, srv)
	k := chunk.Key{Scope: 1}
	if err := tr.Put(ctx, k, payload(1, benchSize)); err != nil {
		b.Fatal(err)
	}
	bucket, name := tr.cfg.Bucket, objectName(tr.cfg.Prefix, k)
	dst := make([]byte, benchSize)

	b.Run("tier", func(b *testing.B) {
		b.SetBytes(benchSize)
		for b.Loop() {
			if n, err := tr.Get(ctx, k, dst); err != nil || n != benchSize {
				b.Fatal(n, err)
			}
		}
	})
	b.Run("minio-readfull", func(b *testing.B) {
		c := srv.rawClient(b)
		b.SetBytes(benchSize)
		for b.Loop() {
			obj, err := c.GetObject(ctx, bucket, name, minio.GetObjectOptions{})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(obj, dst); err != nil {
				b.Fatal(err)
			}
			obj.Close()
		}
	})
	b.Run("minio-readall", func(b *testing.B) {
		c := srv.rawClient(b)
		b.SetBytes(benchSize)
		for b.Loop() {
			obj, err := c.GetObject(ctx, bucket, name, minio.GetObjectOptions{})
			if err != nil {
				b.Fatal(err)
			}
			if got, err := io.ReadAll(obj); err != nil || len(got) != benchSize {
				b.Fatal(len(got), err)
			}
			obj.Close()
		}
	})
}

// BenchmarkPrefixContains64 measures one lookup of 64 stored keys by a
// tier that knows none of them (64 HEADs, Parallelism at a time) against
// the same HEADs sent one after another, on loopback and through a proxy
// that delays every request by 2 ms, as a network to a real store would.
func BenchmarkPrefixContains64(b *testing.B) {
	srv := startBenchServer(b)
	ctx := context.Background()
	writer := benchTier(b, srv)
	keys := make([]chunk.Key, 64)
	for i := range keys {
		keys[i] = chunk.Key{Scope: uint64(i)}
		if err := writer.Put(ctx, keys[i], []byte("kv")); err != nil {
			b.Fatal(err)
		}
	}
	for _, delay := range []time.Duration{0, 2 * time.Millisecond} {
		endpoint := srv.addr
		if delay > 0 {
			endpoint = delayProxy(b, srv.addr, delay)
		}
		cfg := srv.config(writer.cfg.Bucket)
		cfg.Endpoint = endpoint
		b.Run(fmt.Sprintf("delay=%v/tier", delay), func(b *testing.B) {
			tr := srv.openConfig(b, cfg)
			for b.Loop() {
				b.StopTimer()
				tr.known = newPresence(DefaultCacheKeys) // forget every key
				b.StartTimer()
				if n := tr.PrefixContains(keys); n != len(keys) {
					b.Fatal(n)
				}
			}
		})
		b.Run(fmt.Sprintf("delay=%v/sequential-heads", delay), func(b *testing.B) {
			tr := srv.openConfig(b, cfg)
			for b.Loop() {
				for _, k := range keys {
					name := objectName(tr.cfg.Prefix, k)
					if _, err := tr.client.StatObject(ctx, tr.cfg.Bucket, name, minio.StatObjectOptions{}); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// delayProxy forwards TCP connections to target, holding back each chunk
// the client sends by delay: a stand-in for network latency.
func delayProxy(tb testing.TB, target string, delay time.Duration) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	go func() {
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			go func() {
				io.Copy(client, server)
				client.Close()
			}()
			go func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := client.Read(buf)
					if n > 0 {
						time.Sleep(delay)
						if _, werr := server.Write(buf[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				server.Close()
			}()
		}
	}()
	return l.Addr().String()
}

// BenchmarkVersusRaw alternates tier and raw minio-go calls on the same
// bytes within each iteration, so both see the same machine noise, and
// reports each side's throughput and their ratio (tier/raw; 1 is parity).
// The raw side is the request the tier would send done by hand: an
// unsigned single PUT, and GetObject read with io.ReadFull.
func BenchmarkVersusRaw(b *testing.B) {
	srv := startBenchServer(b)
	ctx := context.Background()
	data := payload(2, benchSize)
	dst := make([]byte, benchSize)

	b.Run("put", func(b *testing.B) {
		tr := benchTier(b, srv)
		c := srv.rawClient(b)
		var tierTime, rawTime time.Duration
		for i := 0; b.Loop(); i++ {
			k := chunk.Key{Scope: uint64(i)}
			name := fmt.Sprintf("raw/%d", i)
			tierPut := func() {
				if err := tr.Put(ctx, k, data); err != nil {
					b.Fatal(err)
				}
			}
			rawPut := func() {
				if _, err := c.PutObject(ctx, tr.cfg.Bucket, name, bytes.NewReader(data), benchSize, putOptions); err != nil {
					b.Fatal(err)
				}
			}
			tierTime, rawTime = timePair(i, tierTime, rawTime, tierPut, rawPut)
			b.StopTimer()
			tr.Remove(k)
			c.RemoveObject(ctx, tr.cfg.Bucket, name, minio.RemoveObjectOptions{})
			b.StartTimer()
		}
		reportVersus(b, tierTime, rawTime)
	})
	b.Run("get", func(b *testing.B) {
		tr := benchTier(b, srv)
		c := srv.rawClient(b)
		k := chunk.Key{Scope: 1}
		if err := tr.Put(ctx, k, data); err != nil {
			b.Fatal(err)
		}
		name := objectName(tr.cfg.Prefix, k)
		tierGet := func() {
			if n, err := tr.Get(ctx, k, dst); err != nil || n != benchSize {
				b.Fatal(n, err)
			}
		}
		rawGet := func() {
			obj, err := c.GetObject(ctx, tr.cfg.Bucket, name, minio.GetObjectOptions{})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(obj, dst); err != nil {
				b.Fatal(err)
			}
			obj.Close()
		}
		var tierTime, rawTime time.Duration
		for i := 0; b.Loop(); i++ {
			tierTime, rawTime = timePair(i, tierTime, rawTime, tierGet, rawGet)
		}
		reportVersus(b, tierTime, rawTime)
	})
}

// timePair runs both calls, tier first on even iterations and raw first on
// odd ones so neither always pays for the other's leftovers, and adds each
// call's duration to its total.
func timePair(i int, tierTotal, rawTotal time.Duration, tierCall, rawCall func()) (time.Duration, time.Duration) {
	timed := func(f func()) time.Duration {
		start := time.Now()
		f()
		return time.Since(start)
	}
	if i%2 == 0 {
		tierTotal += timed(tierCall)
		rawTotal += timed(rawCall)
	} else {
		rawTotal += timed(rawCall)
		tierTotal += timed(tierCall)
	}
	return tierTotal, rawTotal
}

func reportVersus(b *testing.B, tierTime, rawTime time.Duration) {
	bytes := float64(b.N) * benchSize
	b.ReportMetric(bytes/tierTime.Seconds()/1e9, "tier-GB/s")
	b.ReportMetric(bytes/rawTime.Seconds()/1e9, "raw-GB/s")
	b.ReportMetric(rawTime.Seconds()/tierTime.Seconds(), "tier/raw")
}
