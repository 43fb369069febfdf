package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/codec"
)

// BenchmarkStagedVsPieceKeys compares two ways of writing a 32 MiB chunk
// into Redis by 512 KiB ranges (a layer's K or V in the shapes of
// docs/layerwise.md) and making it visible at once at the end:
//
//   - staged: SETRANGE into one staging key (this package's Stage), then
//     one script that writes the header and RENAMEs it;
//   - piece-keys: one key per range (SET PX), then one script that
//     APPENDs them into the object's key and deletes them, so readers
//     keep their one key per chunk.
//
// whole-set is one SET of the whole object, as a write after the commit
// does, for reference. It reports the time of the final step (what a
// commit waits for; for whole-set the SET), the
// time of the whole write, and the redis-server's CPU time per chunk
// (INFO cpu, user + system), all from the same run.
func BenchmarkStagedVsPieceKeys(b *testing.B) {
	tr, raw := benchClients(b)
	ctx := context.Background()
	const ranges = 64
	data := payload(benchSize, 5)
	part := benchSize / ranges
	head := make([]byte, codec.PiecedHeaderSize)
	scope := uniqueScope()
	b.Run("staged", func(b *testing.B) {
		var final, cpu time.Duration
		i := 0
		for b.Loop() {
			k := testKey(scope, i)
			i++
			c0 := serverCPU(b, raw)
			st, err := tr.Stage(ctx, k, codec.PiecedHeaderSize+benchSize)
			if err != nil {
				b.Fatal(err)
			}
			for r := range ranges {
				if err := st.WriteAt(ctx, codec.PiecedHeaderSize+r*part, data[r*part:(r+1)*part]); err != nil {
					b.Fatal(err)
				}
			}
			t0 := time.Now()
			if err := st.Publish(ctx, head); err != nil {
				b.Fatal(err)
			}
			final += time.Since(t0)
			cpu += serverCPU(b, raw) - c0
			b.StopTimer()
			tr.Remove(k)
			b.StartTimer()
		}
		b.ReportMetric(float64(final.Microseconds())/1000/float64(b.N), "publish-ms/op")
		b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "redis-cpu-ms/op")
	})
	b.Run("whole-set", func(b *testing.B) {
		var final, cpu time.Duration
		obj := make([]byte, codec.PiecedHeaderSize+benchSize)
		copy(obj[codec.PiecedHeaderSize:], data)
		i := 0
		for b.Loop() {
			k := testKey(scope, 2000+i)
			i++
			c0 := serverCPU(b, raw)
			t0 := time.Now()
			if err := tr.Put(ctx, k, obj); err != nil {
				b.Fatal(err)
			}
			final += time.Since(t0)
			cpu += serverCPU(b, raw) - c0
			b.StopTimer()
			tr.Remove(k)
			b.StartTimer()
		}
		b.ReportMetric(float64(final.Microseconds())/1000/float64(b.N), "publish-ms/op")
		b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "redis-cpu-ms/op")
	})
	b.Run("piece-keys", func(b *testing.B) {
		var final, cpu time.Duration
		i := 0
		for b.Loop() {
			name := tr.keyName(testKey(scope, 1000+i))
			i++
			c0 := serverCPU(b, raw)
			keys := []string{name}
			for r := range ranges {
				pk := "{" + name + "}:piece:" + strconv.Itoa(r)
				keys = append(keys, pk)
				if err := raw.Set(ctx, pk, data[r*part:(r+1)*part], StageTTL).Err(); err != nil {
					b.Fatal(err)
				}
			}
			t0 := time.Now()
			if err := concatScript.Run(ctx, raw, keys, head).Err(); err != nil {
				b.Fatal(err)
			}
			final += time.Since(t0)
			cpu += serverCPU(b, raw) - c0
			b.StopTimer()
			raw.Del(ctx, name)
			b.StartTimer()
		}
		b.ReportMetric(float64(final.Microseconds())/1000/float64(b.N), "publish-ms/op")
		b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "redis-cpu-ms/op")
	})
}

// concatScript: KEYS[1] the object, KEYS[2..] its pieces in order; ARGV[1]
// the header.
var concatScript = goredis.NewScript(`
redis.call('SET', KEYS[1], ARGV[1])
for i = 2, #KEYS do
  redis.call('APPEND', KEYS[1], redis.call('GET', KEYS[i]))
  redis.call('DEL', KEYS[i])
end
return 1
`)

// serverCPU is the redis-server's CPU time so far (INFO cpu).
func serverCPU(b *testing.B, c goredis.UniversalClient) time.Duration {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		name, v, ok := strings.Cut(line, ":")
		if ok && (name == "used_cpu_sys" || name == "used_cpu_user") {
			var f float64
			fmt.Sscan(v, &f)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}
