// Package pdlayer measures prefill/decode pushes per layer
// (docs/disaggregation.md, docs/layerwise.md): two daemons in this
// process, a producer saving chunks layer by layer with a modelled compute
// time per layer and a consumer reading them layerwise, alternating round
// by round between the whole-chunk push (PUSH after COMMIT_STORE) and the
// per-layer push (PUSH of the store lease at the start, each layer sent as
// its STORE_LAYER notice comes). It reports, from the first layer's copy,
// when layer 0 of every chunk is readable on the consumer and when every
// layer is, with ratios taken round by round, and the process's CPU time.
package pdlayer

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/internal/proccpu"
	"kvtier/server"
	"kvtier/wire"
)

// Options choose the shapes measured.
type Options struct {
	Layers      int
	KVHeads     int
	HeadDim     int
	ChunkTokens int
	Chunks      int           // chunks saved together (one store lease)
	Compute     time.Duration // modelled forward-pass time per layer (a sleep, as for a GPU)
	Rounds      int           // rounds per mode; medians are reported
}

// Defaults are the shapes of bench layerwise (32 layers of 8 heads of 128
// fp16 elements, 256-token chunks: 32 MiB each), 4 chunks per save and
// 2 ms of compute per layer.
func Defaults() Options {
	return Options{Layers: 32, KVHeads: 8, HeadDim: 128, ChunkTokens: 256, Chunks: 4, Compute: 2 * time.Millisecond, Rounds: 5}
}

// Stat is a median with its range over the rounds.
type Stat struct{ Median, Min, Max time.Duration }

// Ratio is a per-round ratio, per layer over whole, as median and range.
type Ratio struct{ Median, Min, Max float64 }

// Mode is one way of pushing.
type Mode struct {
	Name   string
	Layer0 Stat // first layer copied → layer 0 of every chunk readable on the consumer
	All    Stat // first layer copied → every layer readable
	CPU    Stat // user+system CPU time of the process for the round (both daemons)
}

// Report is the outcome.
type Report struct {
	Options    Options
	ChunkBytes int
	Whole      Mode
	PerLayer   Mode
	Layer0     Ratio // per-layer layer 0 / whole layer 0
	All        Ratio // per-layer all / whole all
	CPU        Ratio
}

// rig is the two daemons and their clients.
type rig struct {
	o          Options
	chunkBytes int
	span       int
	data       [][]byte
	pc, cc     *client.Client // producer and consumer, local sockets (arena)
	consAddr   string
	stop       []func()
}

// Run measures o, logging progress to log.
func Run(ctx context.Context, o Options, log io.Writer) (*Report, error) {
	if o.Layers <= 0 || o.Chunks <= 0 || o.Rounds <= 0 || o.ChunkTokens <= 0 || o.KVHeads <= 0 || o.HeadDim <= 0 {
		return nil, fmt.Errorf("pdlayer: every shape must be positive: %+v", o)
	}
	r, err := newRig(ctx, o)
	if err != nil {
		return nil, err
	}
	defer r.close()
	rep := &Report{Options: o, ChunkBytes: r.chunkBytes}
	var samples [2][3][]time.Duration // mode × (layer 0, all, cpu)
	for round := range o.Rounds + 1 {
		for mode := range 2 {
			l0, all, cpu, err := r.round(ctx, round, mode == 1)
			if err != nil {
				return nil, err
			}
			if round == 0 {
				continue // warm-up
			}
			samples[mode][0] = append(samples[mode][0], l0)
			samples[mode][1] = append(samples[mode][1], all)
			samples[mode][2] = append(samples[mode][2], cpu)
		}
		fmt.Fprintf(log, "pdlayer: round %d of %d\n", round, o.Rounds)
	}
	rep.Whole = Mode{Name: "whole chunks after the commit", Layer0: stat(samples[0][0]), All: stat(samples[0][1]), CPU: stat(samples[0][2])}
	rep.PerLayer = Mode{Name: "per layer (RECEIVE_LAYERS)", Layer0: stat(samples[1][0]), All: stat(samples[1][1]), CPU: stat(samples[1][2])}
	rep.Layer0 = ratio(samples[1][0], samples[0][0])
	rep.All = ratio(samples[1][1], samples[0][1])
	rep.CPU = ratio(samples[1][2], samples[0][2])
	return rep, nil
}

func newRig(ctx context.Context, o Options) (*rig, error) {
	r := &rig{o: o, chunkBytes: 2 * o.Layers * o.ChunkTokens * o.KVHeads * o.HeadDim * 2}
	r.span = r.chunkBytes / (2 * o.Layers)
	for j := range o.Chunks {
		b := make([]byte, r.chunkBytes)
		for i := range b {
			b[i] = byte(i*7 + j*13 + i>>12)
		}
		r.data = append(r.data, b)
	}
	dir, err := os.MkdirTemp("", "kvtier-pdlayer")
	if err != nil {
		return nil, err
	}
	r.stop = append(r.stop, func() { os.RemoveAll(dir) })
	ram := int64(3*o.Chunks*r.chunkBytes) + 64<<20
	var addrs [2]string
	for i, name := range []string{"producer", "consumer"} {
		sock := filepath.Join(dir, name+".sock")
		tcp, err := r.serve(ram, sock)
		if err != nil {
			r.close()
			return nil, err
		}
		addrs[i] = tcp
		c, err := client.DialUnix(ctx, sock, client.Options{Name: "bench-pdlayer-" + name, Timeout: time.Minute})
		if err != nil {
			r.close()
			return nil, err
		}
		r.stop = append(r.stop, func() { c.Close() })
		if i == 0 {
			r.pc = c
		} else {
			r.cc = c
		}
	}
	r.consAddr = addrs[1]
	return r, nil
}

// serve starts a daemon on sock and a loopback port, returning the port.
func (r *rig) serve(ram int64, sock string) (string, error) {
	eng, err := engine.Open(engine.Options{ChunkSize: r.o.ChunkTokens, RAMBytes: ram, Policy: "LRU", Prefault: true})
	if err != nil {
		return "", err
	}
	svc := server.NewService(eng, server.ServiceOptions{PDReceiveBytes: int64(2 * r.o.Chunks * r.chunkBytes)})
	uln, err := server.ListenUnix(sock, 0)
	if err != nil {
		eng.Close()
		return "", err
	}
	tln, err := svc.ListenTCP("127.0.0.1:0", nil)
	if err != nil {
		uln.Close()
		eng.Close()
		return "", err
	}
	go svc.Serve(uln)
	go svc.Serve(tln)
	r.stop = append(r.stop, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		svc.Shutdown(ctx)
		eng.Close()
	})
	return tln.Addr().String(), nil
}

func (r *rig) close() {
	for i := len(r.stop) - 1; i >= 0; i-- {
		r.stop[i]()
	}
	r.stop = nil
}

// keys returns the round's keys, fresh so nothing is cached already.
func (r *rig) keys(round int, layered bool) []chunk.Key {
	keys := make([]chunk.Key, r.o.Chunks)
	for j := range keys {
		keys[j] = chunk.Key{Scope: 0x9d1a, Hash: chunk.Hash{byte(round), byte(round >> 8), byte(j), 1}}
		if layered {
			keys[j].Hash[3] = 2
		}
	}
	return keys
}

// round saves one store lease on the producer, pushing it one way, while
// the consumer reads it layerwise; it returns when layer 0 and every layer
// were readable, from the first layer's copy, and the CPU time used.
func (r *rig) round(ctx context.Context, round int, layered bool) (layer0, all, cpu time.Duration, err error) {
	keys := r.keys(round, layered)
	sizes := make([]uint32, len(keys))
	for j := range sizes {
		sizes[j] = uint32(r.chunkBytes)
	}
	id := uint64(round*2 + 1)
	if layered {
		id++
	}
	type read struct {
		layer0, all time.Time
		err         error
	}
	got := make(chan read, 1)
	cpu0 := proccpu.Used()
	slots, err := r.pc.PrepareStore(ctx, client.Raw(keys), sizes, 60000)
	if err != nil || len(slots.Slots) != len(keys) {
		return 0, 0, 0, fmt.Errorf("prepare store: %d slots, %v", len(slots.Slots), err)
	}
	if layered {
		if _, err := r.pc.PushStore(ctx, id, r.consAddr, client.Raw(keys), 60000, true, slots.Lease); err != nil {
			return 0, 0, 0, err
		}
	}
	go func() { got <- r.read(ctx, keys, layered) }()
	start := time.Now()
	for l := range r.o.Layers {
		for j, sl := range slots.Slots {
			dst, err := r.pc.Slot(sl)
			if err != nil {
				return 0, 0, 0, err
			}
			for part := range 2 {
				from := (part*r.o.Layers + l) * r.span
				copy(dst[from:from+r.span], r.data[j][from:from+r.span])
			}
		}
		if layered {
			if err := r.pc.StoreLayer(ctx, slots.Lease, l, r.o.Layers, 2); err != nil {
				return 0, 0, 0, err
			}
		}
		time.Sleep(r.o.Compute)
	}
	if _, err := r.pc.CommitStore(ctx, slots.Lease, len(keys)); err != nil {
		return 0, 0, 0, err
	}
	if !layered {
		if _, err := r.pc.Push(ctx, id, r.consAddr, client.Raw(keys), 60000, true); err != nil {
			return 0, 0, 0, err
		}
	}
	rd := <-got
	if rd.err != nil {
		return 0, 0, 0, rd.err
	}
	if err := r.settle(ctx, id, keys); err != nil {
		return 0, 0, 0, err
	}
	return rd.layer0.Sub(start), rd.all.Sub(start), proccpu.Used() - cpu0, nil
}

// read is the consumer's layerwise load: it waits for the chunks (arriving
// ones too when layered), takes them with PREPARE_RETRIEVE_LAYERS, waits
// for layer 0 and then the last layer, and checks every byte.
func (r *rig) read(ctx context.Context, keys []chunk.Key, layered bool) (out struct {
	layer0, all time.Time
	err         error
}) {
	n := uint32(len(keys))
	var w wire.WaitReply
	if layered {
		w, out.err = r.cc.WaitInProgress(ctx, client.Raw(keys), n, 60000)
	} else {
		w, out.err = r.cc.Wait(ctx, client.Raw(keys), n, 60000)
	}
	if out.err == nil && w.Chunks != n {
		out.err = fmt.Errorf("wait: %d of %d chunks", w.Chunks, n)
	}
	if out.err != nil {
		return out
	}
	slots, err := r.cc.PrepareRetrieveLayers(ctx, client.Raw(keys), r.o.Layers, 2, 60000)
	if err != nil || len(slots.Slots) != len(keys) {
		out.err = fmt.Errorf("prepare retrieve layers: %d slots, %v", len(slots.Slots), err)
		return out
	}
	defer r.cc.Release(ctx, slots.Lease)
	for _, layer := range []int{0, r.o.Layers - 1} {
		ready, err := r.cc.LayerWait(ctx, slots.Lease, layer)
		if err != nil || ready.Usable != n {
			out.err = fmt.Errorf("layer %d: %+v, %v", layer, ready, err)
			return out
		}
		if layer == 0 {
			out.layer0 = time.Now()
		}
	}
	out.all = time.Now()
	for j, sl := range slots.Slots {
		b, err := r.cc.Slot(sl)
		if err != nil || !slices.Equal(b, r.data[j]) {
			out.err = fmt.Errorf("chunk %d read on the consumer differs from the one saved (%v)", j, err)
			return out
		}
	}
	return out
}

// settle waits for the transfer to end and clears both daemons' RAM, so
// the next round starts empty.
func (r *rig) settle(ctx context.Context, id uint64, keys []chunk.Key) error {
	for {
		st, err := r.pc.PushStatus(ctx, id)
		if err != nil {
			return err
		}
		if st.State == wire.TransferFailed {
			return fmt.Errorf("transfer %d failed: %s", id, st.Message)
		}
		if st.State == wire.TransferDone {
			break
		}
		time.Sleep(time.Millisecond)
	}
	for _, c := range []*client.Client{r.pc, r.cc} { // every scope: the keys are raw
		if _, err := c.Clear(ctx, 0); err != nil {
			return err
		}
	}
	return nil
}

func stat(xs []time.Duration) Stat {
	s := slices.Clone(xs)
	slices.Sort(s)
	return Stat{Median: s[len(s)/2], Min: s[0], Max: s[len(s)-1]}
}

func ratio(num, den []time.Duration) Ratio {
	rs := make([]float64, len(num))
	for i := range num {
		rs[i] = float64(num[i]) / float64(den[i])
	}
	slices.Sort(rs)
	return Ratio{Median: rs[len(rs)/2], Min: rs[0], Max: rs[len(rs)-1]}
}

// Print writes the report as text.
func (rep *Report) Print(w io.Writer) {
	o := rep.Options
	fmt.Fprintf(w, "pdlayer: %d chunks of %.0f MiB (%d layers × %d heads × %d fp16, %d tokens), %v compute per layer, %d rounds\n",
		o.Chunks, float64(rep.ChunkBytes)/(1<<20), o.Layers, o.KVHeads, o.HeadDim, o.ChunkTokens, o.Compute, o.Rounds)
	for _, m := range []Mode{rep.Whole, rep.PerLayer} {
		fmt.Fprintf(w, "  %-32s layer 0 readable %s  all layers %s  CPU %s\n", m.Name, m.Layer0, m.All, m.CPU)
	}
	fmt.Fprintf(w, "  per layer / whole, per round:   layer 0 %s  all layers %s  CPU %s\n", rep.Layer0, rep.All, rep.CPU)
}

func (s Stat) String() string {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return fmt.Sprintf("%.2f ms (%.2f–%.2f)", ms(s.Median), ms(s.Min), ms(s.Max))
}

func (r Ratio) String() string { return fmt.Sprintf("%.3f (%.3f–%.3f)", r.Median, r.Min, r.Max) }
