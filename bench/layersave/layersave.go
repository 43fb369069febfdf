// Package layersave measures per-layer saves (docs/layerwise.md): a store
// whose layers are written to the disk tier as STORE_LAYER notices arrive
// against the same store written whole after its commit (write-behind),
// on the same shapes, alternating round by round. It reports how long
// after the commit the chunks are durable on disk, how long the whole
// save takes from the first layer, the write throughput that gives and the
// process's CPU time, with ratios taken round by round.
package layersave

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"kvtier/chunk"
	"kvtier/engine"
	"kvtier/internal/proccpu"
	"kvtier/tier"
)

// Options choose the shapes measured.
type Options struct {
	Dir         string // disk tier directory: a real disk (tmpfs refuses O_DIRECT)
	Layers      int
	KVHeads     int
	HeadDim     int
	ChunkTokens int
	Chunks      int // chunks saved together (one store lease)
	Rounds      int // rounds per figure; medians are reported
	// Redis saves into a Redis tier instead of the disk tier: a
	// redis-server started on loopback (redis.go). Durable then means
	// stored in Redis (its object published or SET).
	Redis bool
}

// Defaults are the shapes of bench layerwise: 32 layers of 8 heads of 128
// fp16 elements, 256-token chunks (32 MiB each), 8 chunks per save.
func Defaults(dir string) Options {
	return Options{Dir: dir, Layers: 32, KVHeads: 8, HeadDim: 128, ChunkTokens: 256, Chunks: 8, Rounds: 5}
}

// Mode is one way of saving.
type Mode struct {
	Name        string
	AfterCommit Stat    // commit to every chunk durable on disk
	Total       Stat    // first layer to every chunk durable
	MBps        float64 // bytes saved / Total, median round
	CPU         Stat    // user+system CPU time of the process for the round
	StoreCPU    Stat    // the redis-server's CPU time for the round (Redis target)
}

// Stat is a median with its range over the rounds.
type Stat struct{ Median, Min, Max time.Duration }

// Ratio is a per-round ratio, per-layer over whole, as median and range.
type Ratio struct{ Median, Min, Max float64 }

// Case is one forward-pass speed: every mode, and the per-round ratios.
type Case struct {
	Name        string
	PerLayer    time.Duration // modelled compute per layer between two layers' copies
	Whole       Mode
	Layered     Mode
	AfterCommit Ratio // layered / whole
	Total       Ratio
	CPU         Ratio
	StoreCPU    Ratio
}

// Result is a whole run.
type Result struct {
	ChunkBytes int
	Chunks     int
	Rounds     int
	DirectIO   bool
	Target     string // "disk" or "redis"
	// RangeSaved counts the chunks the target tier committed from range
	// writes (all the per-layer saves', unless some fell back to whole).
	RangeSaved uint64
	Cases      []Case
}

// round is what one save measured.
type round struct{ afterCommit, total, cpu, storeCPU time.Duration }

// Run measures both modes with no compute between layers (back-to-back
// saves: throughput) and with a compute time per layer equal to a
// whole-chunk warm-up save's write time (commit to durable) divided by the
// layers (write ≈ compute).
func Run(ctx context.Context, o Options, log io.Writer) (Result, error) {
	size := 2 * o.Layers * o.ChunkTokens * o.KVHeads * o.HeadDim * 2
	r := Result{ChunkBytes: size, Chunks: o.Chunks, Rounds: o.Rounds}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return r, err
	}
	dir, err := os.MkdirTemp(o.Dir, "run-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	total := int64(size) * int64(o.Chunks)
	eo := engine.Options{ChunkSize: o.ChunkTokens, RAMBytes: 2*total + 64<<20, Policy: "LRU",
		DiskDir: dir, DiskBytes: 4*total + 64<<20}
	var srv *redisServer
	r.Target = "disk"
	if o.Redis {
		if srv, err = startRedis(dir); err != nil {
			return r, err
		}
		defer srv.stop()
		eo.DiskDir, eo.DiskBytes, eo.RemoteURLs, r.Target = "", 0, []string{srv.url()}, "redis"
	}
	eng, err := engine.Open(eo)
	if err != nil {
		return r, err
	}
	defer eng.Close()
	b := &bench{eng: eng, disk: eng.Manager().Tiers()[1], redis: srv, o: o, size: size, src: make([][]byte, o.Chunks)}
	if d, ok := b.disk.(interface{ DirectIO() bool }); ok {
		r.DirectIO = d.DirectIO()
	}
	for i := range b.src {
		b.src[i] = make([]byte, size)
		rand.Read(b.src[i])
	}
	fmt.Fprintf(log, "layersave: %d chunks of %d MiB, %d layers, into %s in %s (direct I/O %v)\n", o.Chunks, size>>20, o.Layers, r.Target, dir, r.DirectIO)
	// A warm-up save of each mode. The whole-chunk one sizes the balanced
	// case: its write time (commit to durable) spread over the layers.
	warm, err := b.save(ctx, false, 0)
	if err != nil {
		return r, err
	}
	if _, err := b.save(ctx, true, 0); err != nil {
		return r, err
	}
	for _, c := range []struct {
		name string
		per  time.Duration
	}{{"no compute (back to back)", 0}, {"write ≈ compute", warm.afterCommit / time.Duration(o.Layers)}} {
		row, err := b.runCase(ctx, c.name, c.per, log)
		if err != nil {
			return r, err
		}
		r.Cases = append(r.Cases, row)
	}
	_, qs := eng.Manager().Stats()
	r.RangeSaved = qs[0].LayerSaved
	return r, nil
}

type bench struct {
	eng   *engine.Engine
	disk  tier.Tier    // the tier saved into: disk or Redis
	redis *redisServer // with the Redis target
	o     Options
	size  int
	src   [][]byte
	seq   uint64
}

// runCase alternates the two modes for o.Rounds rounds, whole first in
// even rounds and layered first in odd ones.
func (b *bench) runCase(ctx context.Context, name string, per time.Duration, log io.Writer) (Case, error) {
	var whole, layered []round
	for i := range b.o.Rounds {
		for _, lay := range []bool{i%2 == 1, i%2 == 0} {
			rd, err := b.save(ctx, lay, per)
			if err != nil {
				return Case{}, err
			}
			if lay {
				layered = append(layered, rd)
			} else {
				whole = append(whole, rd)
			}
		}
		fmt.Fprintf(log, "  %s round %d: after commit whole %v layered %v; total whole %v layered %v\n", name, i,
			whole[i].afterCommit.Round(time.Microsecond), layered[i].afterCommit.Round(time.Microsecond),
			whole[i].total.Round(time.Microsecond), layered[i].total.Round(time.Microsecond))
	}
	bytes := float64(b.size * b.o.Chunks)
	c := Case{Name: name, PerLayer: per, Whole: b.mode("whole chunk after commit", whole, bytes),
		Layered: b.mode("per layer (STORE_LAYER)", layered, bytes)}
	c.AfterCommit = ratio(layered, whole, func(r round) time.Duration { return r.afterCommit })
	c.Total = ratio(layered, whole, func(r round) time.Duration { return r.total })
	c.CPU = ratio(layered, whole, func(r round) time.Duration { return r.cpu })
	c.StoreCPU = ratio(layered, whole, func(r round) time.Duration { return r.storeCPU })
	return c, nil
}

func (b *bench) mode(name string, rs []round, bytes float64) Mode {
	m := Mode{Name: name, AfterCommit: stat(rs, func(r round) time.Duration { return r.afterCommit }),
		Total: stat(rs, func(r round) time.Duration { return r.total }), CPU: stat(rs, func(r round) time.Duration { return r.cpu }),
		StoreCPU: stat(rs, func(r round) time.Duration { return r.storeCPU })}
	m.MBps = bytes / m.Total.Median.Seconds() / 1e6
	return m
}

// save stores o.Chunks fresh chunks as a connector does: PREPARE_STORE,
// each layer copied into the slots followed (layered) by a STORE_LAYER
// notice and per of modelled compute, then COMMIT_STORE; it returns once
// every chunk is durable on disk, and removes them afterwards.
func (b *bench) save(ctx context.Context, layered bool, per time.Duration) (round, error) {
	keys := make([]chunk.Key, b.o.Chunks)
	sizes := make([]uint32, b.o.Chunks)
	for i := range keys {
		b.seq++
		keys[i].Scope = 0x1a7e5a7e
		binary.LittleEndian.PutUint64(keys[i].Hash[:], b.seq)
		binary.LittleEndian.PutUint64(keys[i].Hash[8:], uint64(time.Now().UnixNano()))
		sizes[i] = uint32(b.size)
	}
	geo := engine.Layers{Layers: b.o.Layers, Parts: 2}
	cpu0, store0, start := proccpu.Used(), b.storeCPU(), time.Now()
	slots, id, err := b.eng.PrepareStore(keys, sizes, time.Minute, nil)
	if err != nil || len(slots) != len(keys) {
		return round{}, fmt.Errorf("layersave: prepare store: %d of %d slots: %v", len(slots), len(keys), err)
	}
	bufs := make([][]byte, len(slots))
	for i, s := range slots {
		if bufs[i], err = b.eng.Arena().Region(int64(s.Offset), int(s.Len)); err != nil {
			return round{}, err
		}
	}
	span := b.size / (2 * b.o.Layers)
	for layer := range b.o.Layers {
		for i, dst := range bufs {
			for _, part := range []int{layer, b.o.Layers + layer} {
				copy(dst[part*span:(part+1)*span], b.src[i][part*span:(part+1)*span])
			}
		}
		if layered {
			b.eng.StoreLayer(id, layer, geo)
		}
		if per > 0 {
			time.Sleep(per)
		}
	}
	commit := time.Now()
	if n, err := b.eng.CommitStore(id, len(keys)); err != nil || n != len(keys) {
		return round{}, fmt.Errorf("layersave: commit: %d of %d: %v", n, len(keys), err)
	}
	deadline := commit.Add(time.Minute) // a tier that never gets the chunks fails the run
	for _, k := range keys {
		for !tier.Contains(b.disk, k) {
			if err := ctx.Err(); err != nil {
				return round{}, err
			}
			if time.Now().After(deadline) {
				return round{}, fmt.Errorf("layersave: chunk not in the %s tier a minute after the commit", b.disk.Name())
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	end := time.Now()
	rd := round{afterCommit: end.Sub(commit), total: end.Sub(start), cpu: proccpu.Used() - cpu0, storeCPU: b.storeCPU() - store0}
	if err := b.eng.Flush(ctx); err != nil {
		return rd, err
	}
	for _, k := range keys {
		b.eng.Manager().Remove(k)
	}
	return rd, nil
}

// storeCPU is the redis-server's CPU time so far, 0 without one.
func (b *bench) storeCPU() time.Duration {
	if b.redis == nil {
		return 0
	}
	return b.redis.cpu()
}

func stat(rs []round, f func(round) time.Duration) Stat {
	v := make([]time.Duration, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	return Stat{Median: v[len(v)/2], Min: v[0], Max: v[len(v)-1]}
}

func ratio(num, den []round, f func(round) time.Duration) Ratio {
	v := make([]float64, len(num))
	for i := range num {
		v[i] = float64(f(num[i])) / float64(max(f(den[i]), 1))
	}
	slices.Sort(v)
	return Ratio{Median: v[len(v)/2], Min: v[0], Max: v[len(v)-1]}
}

// Print writes the result as tables.
func (r Result) Print(w io.Writer) {
	redis := r.Target == "redis"
	fmt.Fprintf(w, "%d chunks of %d MiB per save into %s, %d rounds, direct I/O %v; medians (min–max)\n\n", r.Chunks, r.ChunkBytes>>20, r.Target, r.Rounds, r.DirectIO)
	fmt.Fprint(w, "| case | per layer | mode | commit → durable | first layer → durable | MB/s | CPU |")
	if redis {
		fmt.Fprint(w, " Redis CPU |")
	}
	fmt.Fprint(w, "\n|---|---:|---|---:|---:|---:|---:|")
	if redis {
		fmt.Fprint(w, "---:|")
	}
	fmt.Fprintln(w)
	for _, c := range r.Cases {
		for _, m := range []Mode{c.Whole, c.Layered} {
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %.0f | %s |", c.Name, ms(c.PerLayer), m.Name, m.AfterCommit, m.Total, m.MBps, m.CPU)
			if redis {
				fmt.Fprintf(w, " %s |", m.StoreCPU)
			}
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintln(w, "\nper-round ratios, per layer / whole: median (min–max)")
	fmt.Fprint(w, "\n| case | commit → durable | first layer → durable | CPU |")
	if redis {
		fmt.Fprint(w, " Redis CPU |")
	}
	fmt.Fprint(w, "\n|---|---:|---:|---:|")
	if redis {
		fmt.Fprint(w, "---:|")
	}
	fmt.Fprintln(w)
	for _, c := range r.Cases {
		fmt.Fprintf(w, "| %s | %s | %s | %s |", c.Name, c.AfterCommit, c.Total, c.CPU)
		if redis {
			fmt.Fprintf(w, " %s |", c.StoreCPU)
		}
		fmt.Fprintln(w)
	}
}

func (s Stat) String() string {
	return fmt.Sprintf("%s (%s–%s)", ms(s.Median), ms(s.Min), ms(s.Max))
}

func (q Ratio) String() string { return fmt.Sprintf("%.3f (%.3f–%.3f)", q.Median, q.Min, q.Max) }

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }
