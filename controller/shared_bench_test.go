package controller

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/cluster"
	"kvtier/internal/redistest"
	"kvtier/router/index"
	"kvtier/router/redisindex"
)

// BenchmarkSharedLookup measures a cluster lookup of a 128-chunk prompt
// held by 8 daemons (RAM, half on disk too) through the shared
// registry's index in a real redis-server on loopback, against the same
// lookup in an in-memory index in the same run. A lookup reads a key's
// holders in O(1), so the index holds only the prompt. It reports p50
// and p99 of the Redis lookups and the ratio of the p50s.
func BenchmarkSharedLookup(b *testing.B) {
	srv := redistest.Start(b)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer rdb.Close()
	keys := make([]uint64, benchPrompt)
	for i := range keys {
		keys[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	var regs []*registry
	for _, inRedis := range []bool{false, true} {
		pods := index.NewPods()
		var ix index.Store
		var err error
		if inRedis {
			ix, err = redisindex.New(redisindex.Config{Client: rdb}, pods)
		} else {
			ix, err = index.New(index.Config{MaxBlocks: 1 << 16})
		}
		if err != nil {
			b.Fatal(err)
		}
		reg := newRegistry(nil, ix, pods, time.Second, 3, slog.New(slog.DiscardHandler))
		for d := range benchDaemons {
			name := fmt.Sprintf("d%d", d)
			id, err := pods.Intern(cluster.HolderPrefix + name)
			if err != nil {
				b.Fatal(err)
			}
			reg.members[name] = &daemonRecord{reg: cluster.Register{Instance: name, Addr: fmt.Sprintf("10.0.0.%d:7482", d)}}
			if err := ix.Add(id, index.CPU, keys); err != nil {
				b.Fatal(err)
			}
			if err := ix.Add(id, index.Disk, keys[:len(keys)/2]); err != nil {
				b.Fatal(err)
			}
		}
		reg.publishLocked()
		regs = append(regs, reg)
	}
	mem, red := &lookupScratch{keys: keys}, &lookupScratch{keys: keys}
	tookMem := make([]time.Duration, 0, b.N)
	tookRedis := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		mem.out = regs[0].appendLookup(mem.out[:0], mem)
		tookMem = append(tookMem, time.Since(start))
		start = time.Now()
		red.out = regs[1].appendLookup(red.out[:0], red)
		tookRedis = append(tookRedis, time.Since(start))
	}
	b.StopTimer()
	if a, c := resolved(b, mem.out), resolved(b, red.out); a != c {
		b.Fatalf("the lookups differ:\n%.300s\n%.300s", a, c)
	}
	slices.Sort(tookMem)
	slices.Sort(tookRedis)
	p50m, p50r := tookMem[len(tookMem)/2], tookRedis[len(tookRedis)/2]
	b.ReportMetric(float64(p50r.Nanoseconds())/1e3, "redis-p50-µs")
	b.ReportMetric(float64(tookRedis[len(tookRedis)*99/100].Nanoseconds())/1e3, "redis-p99-µs")
	b.ReportMetric(float64(p50m.Nanoseconds())/1e3, "memory-p50-µs")
	b.ReportMetric(float64(p50r)/float64(p50m), "redis/memory")
}

// resolved renders a lookup reply as sorted "instance/tier" per key: the
// Redis index lists a key's holders in no fixed order.
func resolved(b *testing.B, reply []byte) string {
	var r cluster.LookupReply
	if err := json.Unmarshal(reply, &r); err != nil {
		b.Fatal(err)
	}
	hs, err := r.Resolve(benchPrompt)
	if err != nil {
		b.Fatal(err)
	}
	var out []string
	for _, h := range hs {
		var s []string
		for _, x := range h {
			s = append(s, x.Instance+"/"+x.Tier)
		}
		slices.Sort(s)
		out = append(out, strings.Join(s, ","))
	}
	return strings.Join(out, " | ")
}
