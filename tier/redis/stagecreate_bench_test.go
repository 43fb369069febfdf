package redis

import (
	"context"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// BenchmarkStageCreate compares two ways of creating a staging key for a
// chunk of size bytes that is then filled by 2 parts × 32 layers of
// SETRANGE, in the order a per-layer save writes them (layer l of part 0,
// then of part 1):
//
//   - full: created at its full length (SET of the marker, SETRANGE of
//     the last byte, one MULTI: Redis zero-fills the whole key at once);
//   - grow: created with the marker alone; each SETRANGE past the end
//     grows it (zero-filling up to the write).
//
// It reports the time of the creating call, the longest single write
// (how long Redis was busy with one command), and Redis' CPU time per
// chunk (INFO cpu).
func BenchmarkStageCreate(b *testing.B) {
	_, raw := benchClients(b)
	ctx := context.Background()
	for _, size := range []int{32 << 20, 128 << 20} {
		data := payload(size, 7)
		const layers, parts = 32, 2
		span := size / parts / layers
		for _, mode := range []string{"full", "grow"} {
			b.Run(mode+"-"+strconv.Itoa(size>>20)+"MiB", func(b *testing.B) {
				var create, longest, cpu time.Duration
				for b.Loop() {
					key := "{bench}:stage:" + mode
					c0 := serverCPU(b, raw)
					t0 := time.Now()
					_, err := raw.TxPipelined(ctx, func(p goredis.Pipeliner) error {
						p.Set(ctx, key, "KVTSTAGE00000000", time.Minute)
						if mode == "full" {
							p.SetRange(ctx, key, int64(size-1), "\x00")
						}
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
					create += time.Since(t0)
					for l := range layers {
						for part := range parts {
							off := part*size/parts + l*span
							t1 := time.Now()
							_, err := raw.TxPipelined(ctx, func(p goredis.Pipeliner) error {
								p.Do(ctx, "setrange", key, 16+off, data[off:off+span])
								p.PExpire(ctx, key, time.Minute)
								return nil
							})
							if err != nil {
								b.Fatal(err)
							}
							longest = max(longest, time.Since(t1))
						}
					}
					cpu += serverCPU(b, raw) - c0
					raw.Del(ctx, key)
				}
				b.ReportMetric(float64(create.Microseconds())/1000/float64(b.N), "create-ms/op")
				b.ReportMetric(float64(longest.Microseconds())/1000, "longest-write-ms")
				b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "redis-cpu-ms/op")
			})
		}
	}
}
