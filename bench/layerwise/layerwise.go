// Package layerwise measures layerwise retrieval (docs/layerwise.md): how
// soon layer 0 of a cached prefix is ready next to the whole prefix, per
// lower tier; what that does to time-to-first-token when the forward pass
// overlaps the loads; and that RAM hits lose nothing. Every ratio compares
// two measurements taken in the same run on the same chunks.
package layerwise

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"kvtier/chunk"
	"kvtier/engine"
	"kvtier/internal/proccpu"
	"kvtier/kvformat"
)

// Options choose the shapes and tiers measured.
type Options struct {
	Dir         string // disk tier directory: a real disk (tmpfs refuses O_DIRECT)
	Redis       string // redis:// URL of a Redis to measure too; "" skips it
	S3          string // s3:// URL of an S3 bucket to measure too; "" skips it
	Peer        bool   // also measure loads from a peer daemon's disk and RAM (peer.go)
	Layers      int
	KVHeads     int
	HeadDim     int
	ChunkTokens int
	Chunks      int // chunks in the cached prefix
	Rounds      int // rounds per figure; the median is reported
}

// Defaults are the shapes of the issue: 32 layers of 8 heads of 128 fp16
// elements, 256-token chunks (32 MiB each), an 8-chunk prefix.
func Defaults(dir string) Options {
	return Options{Dir: dir, Layers: 32, KVHeads: 8, HeadDim: 128, ChunkTokens: 256, Chunks: 8, Rounds: 5}
}

// TierRow is one lower tier's load times for the prefix, medians over the
// rounds.
type TierRow struct {
	Tier     string
	Whole    time.Duration // PrepareRetrieve: every chunk promoted before the reply
	Reply    time.Duration // PrepareRetrieveLayers' reply
	Layer0   time.Duration // layer 0 of every chunk in place
	All      time.Duration // every layer in place
	Ratio    float64       // Layer0 / All; the goal is at most 1/16
	Compared string        // notes on the setup (direct I/O or not)
	// CPU time of this process (user + system, every thread: the peer
	// daemon of the P2P rows too) per load, medians: whole, and every
	// layer by layers.
	WholeCPU, LayersCPU time.Duration
	// Requests the peer daemon served per load (every operation: round
	// trips), medians, whole and by layers; P2P rows only.
	WholeRequests, LayersRequests float64
}

// TTFTRow is the modelled time to first token with the prefix on a lower
// tier: load plus a forward pass of Layers layers of PerLayer each, whole
// (every chunk loaded, then the pass) against layerwise (layer i computed
// once it is in place). Speedup is Whole / Layerwise.
type TTFTRow struct {
	Tier      string
	Case      string // "load ≈ compute", "load ≪ compute", "load ≫ compute"
	PerLayer  time.Duration
	Whole     time.Duration
	Layerwise time.Duration
	Speedup   float64
}

// RAMRow compares the two retrieve operations on a prefix held in RAM.
// The operations alone: PrepareRetrieve + Release against
// PrepareRetrieveLayers + LayerWait(0) + Release, per request. The load
// as a connector does it: the same with every chunk's bytes copied out of
// the arena layer by layer, after each wait the answers ask for.
type RAMRow struct {
	Today         time.Duration
	Layerwise     time.Duration
	Ratio         float64 // Layerwise / Today
	LoadToday     time.Duration
	LoadLayerwise time.Duration
	LoadRatio     float64 // LoadLayerwise / LoadToday; the goal is at most 1.05
}

// Result is a whole run.
type Result struct {
	Format     string
	ChunkBytes int
	Chunks     int
	Tiers      []TierRow
	TTFT       []TTFTRow
	RAM        RAMRow
}

// Run measures the disk tier (and Redis and S3 when o.Redis, o.S3 are set,
// a peer daemon's disk and RAM with o.Peer) and the RAM path, writing
// progress to log.
func Run(ctx context.Context, o Options, log io.Writer) (Result, error) {
	spec := kvformat.Spec{Layers: o.Layers, KVHeads: o.KVHeads, HeadDim: o.HeadDim, DType: kvformat.Float16,
		Layout: kvformat.Layout2LTD, ChunkTokens: o.ChunkTokens}
	if err := spec.Validate(); err != nil {
		return Result{}, err
	}
	size := 2 * o.Layers * o.ChunkTokens * o.KVHeads * o.HeadDim * 2
	r := Result{Format: spec.Tag(), ChunkBytes: size, Chunks: o.Chunks}
	f, err := newFixture(o, spec, size)
	if err != nil {
		return r, err
	}
	defer f.close()
	fmt.Fprintf(log, "layerwise: %d chunks of %d MiB (%s) on disk in %s\n", o.Chunks, size>>20, spec.Tag(), o.Dir)
	row, perLayer, err := f.tierRow(ctx, "disk", o.Rounds)
	if err != nil {
		return r, err
	}
	r.Tiers = append(r.Tiers, row)
	if r.TTFT, err = f.ttft(ctx, "disk", perLayer, o.Rounds); err != nil {
		return r, err
	}
	for _, remote := range []struct{ name, url string }{{"redis", o.Redis}, {"s3", o.S3}} {
		if remote.url == "" {
			continue
		}
		rf, err := newRemoteFixture(o, remote.url, spec, size)
		if err != nil {
			return r, err
		}
		defer rf.close()
		fmt.Fprintf(log, "layerwise: the same prefix in %s\n", remote.name)
		row, perLayer, err := rf.tierRow(ctx, remote.name, o.Rounds)
		if err != nil {
			return r, err
		}
		r.Tiers = append(r.Tiers, row)
		tt, err := rf.ttft(ctx, remote.name, perLayer, o.Rounds)
		if err != nil {
			return r, err
		}
		r.TTFT = append(r.TTFT, tt...)
	}
	if o.Peer {
		rows, tt, err := peerRows(ctx, o, spec, size, func(format string, a ...any) { fmt.Fprintf(log, format, a...) })
		r.Tiers, r.TTFT = append(r.Tiers, rows...), append(r.TTFT, tt...)
		if err != nil {
			return r, err
		}
	}
	fmt.Fprintln(log, "layerwise: RAM path")
	r.RAM, err = f.ram(ctx)
	return r, err
}

// fixture is an engine holding the prefix in a lower tier.
type fixture struct {
	eng      *engine.Engine
	keys     []chunk.Key
	data     [][]byte
	layers   int
	dir      string         // the disk tier's, removed by close
	before   func()         // run by evict: where the peer rows put the prefix on the peer
	requests func() float64 // requests the peer has served so far (P2P rows); nil elsewhere
	given    engine.Layers
}

// newFixture holds the prefix in a fresh disk tier under o.Dir (a tier
// left by an earlier run would keep that run's bytes under the same keys).
func newFixture(o Options, spec kvformat.Spec, size int) (*fixture, error) {
	total := int64(size) * int64(o.Chunks)
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(o.Dir, "run-")
	if err != nil {
		return nil, err
	}
	f, err := openFixture(engine.Options{ChunkSize: o.ChunkTokens, RAMBytes: 2*total + 64<<20, Policy: "LRU",
		DiskDir: dir, DiskBytes: 2*total + 64<<20}, o, spec, size)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	f.dir = dir
	return f, nil
}

// newRemoteFixture holds the prefix in the remote store at url (raw codec)
// with no disk tier.
func newRemoteFixture(o Options, url string, spec kvformat.Spec, size int) (*fixture, error) {
	total := int64(size) * int64(o.Chunks)
	return openFixture(engine.Options{ChunkSize: o.ChunkTokens, RAMBytes: 2*total + 64<<20, Policy: "LRU",
		RemoteURLs: []string{url}, RemoteTimeout: 10 * time.Second}, o, spec, size)
}

func openFixture(eo engine.Options, o Options, spec kvformat.Spec, size int) (*fixture, error) {
	eng, err := engine.Open(eo)
	if err != nil {
		return nil, err
	}
	f := &fixture{eng: eng, layers: spec.Layers}
	if err := f.fill(spec, size, o.Chunks); err != nil {
		eng.Close()
		return nil, err
	}
	return f, nil
}

// fill stores the prefix (random bytes) in every tier and waits for the
// lower tiers to have it.
func (f *fixture) fill(spec kvformat.Spec, size, n int) error {
	ctx := context.Background()
	// A scope of its own per run: a shared store may hold an earlier run's
	// chunks under the same keys, and a store keeps what it holds.
	var salt [8]byte
	rand.Read(salt[:])
	scope := chunk.Scope{Model: fmt.Sprintf("bench-layerwise-%x", salt), WorldSize: 1, Format: spec.Tag()}
	tokens := make([]uint32, n*spec.ChunkTokens)
	for i := range tokens {
		tokens[i] = uint32(i*13 + 7)
	}
	req := engine.Request{Scope: scope, Tokens: tokens}
	keys, _, _, err := f.eng.Keys(nil, req)
	if err != nil {
		return err
	}
	f.keys = slices.Clone(keys)
	f.data = make([][]byte, n)
	for i := range f.data {
		f.data[i] = make([]byte, size)
		rand.Read(f.data[i])
	}
	if stored, err := f.eng.Store(ctx, req, f.data); err != nil || stored != n {
		return fmt.Errorf("layerwise: stored %d of %d chunks: %v", stored, n, err)
	}
	return f.eng.Flush(ctx)
}

func (f *fixture) close() error {
	for _, k := range f.keys { // leave nothing behind in a shared store
		f.eng.Manager().Remove(k)
	}
	err := f.eng.Close()
	if f.dir != "" {
		err = errors.Join(err, os.RemoveAll(f.dir))
	}
	return err
}

// evict takes the prefix out of RAM, so the next retrieve reads it from
// the lower tier.
func (f *fixture) evict() {
	for _, k := range f.keys {
		f.eng.Manager().RAM().Remove(k)
	}
	if f.before != nil {
		f.before()
	}
}

// settle waits until a layerwise retrieve's chunks are committed to RAM,
// so that evict finds them there.
func (f *fixture) settle(ctx context.Context) error {
	for {
		n, _ := f.eng.LookupKeys(f.keys)
		all := n == len(f.keys)
		for _, k := range f.keys {
			all = all && f.eng.InRAM(k)
		}
		if all {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Microsecond):
		}
	}
}

const leaseTTL = time.Minute

// whole times PrepareRetrieve of the evicted prefix and checks its bytes.
func (f *fixture) whole(ctx context.Context, check bool) (time.Duration, error) {
	f.evict()
	start := time.Now()
	slots, id, err := f.eng.PrepareRetrieve(ctx, f.keys, leaseTTL, nil)
	took := time.Since(start)
	if err == nil && len(slots) != len(f.keys) {
		err = fmt.Errorf("layerwise: whole retrieve got %d of %d chunks", len(slots), len(f.keys))
	}
	if err == nil && check {
		err = f.check(slots)
	}
	f.eng.Release(id)
	return took, err
}

// stream times PrepareRetrieveLayers of the evicted prefix: the reply,
// layer 0 and every layer, calling each layer's compute (may be nil) once
// it is ready; done is when the last compute ended.
func (f *fixture) stream(ctx context.Context, check bool, compute func()) (reply, layer0, all, done time.Duration, err error) {
	f.evict()
	start := time.Now()
	slots, id, err := f.eng.PrepareRetrieveLayers(ctx, f.keys, f.given, leaseTTL, nil)
	reply = time.Since(start)
	defer f.eng.Release(id)
	if err == nil && len(slots) != len(f.keys) {
		err = fmt.Errorf("layerwise: retrieve got %d of %d chunks", len(slots), len(f.keys))
	}
	for layer := 0; err == nil && layer < f.layers; layer++ {
		usable, _, werr := f.eng.LayerWait(ctx, id, layer)
		switch {
		case werr != nil:
			err = werr
		case usable != len(f.keys):
			err = fmt.Errorf("layerwise: %d of %d chunks usable", usable, len(f.keys))
		}
		if layer == 0 {
			layer0 = time.Since(start)
		}
		if compute != nil {
			compute()
		}
	}
	all = time.Since(start) // with compute, the end of the forward pass
	done = all
	if err == nil && check {
		err = f.check(slots)
	}
	if err == nil {
		err = f.settle(ctx)
	}
	return reply, layer0, all, done, err
}

// check compares the slots' bytes with what was stored.
func (f *fixture) check(slots []engine.Slot) error {
	a := f.eng.Arena()
	for i, s := range slots {
		got, err := a.Region(int64(s.Offset), int(s.Len))
		if err != nil {
			return err
		}
		if string(got) != string(f.data[i]) {
			return fmt.Errorf("layerwise: chunk %d holds wrong bytes", i)
		}
	}
	return nil
}

// tierRow measures the tier holding the prefix: medians of whole and
// layerwise loads, alternated round by round. It also returns the
// per-layer compute time that makes compute equal to the whole load.
func (f *fixture) tierRow(ctx context.Context, name string, rounds int) (TierRow, time.Duration, error) {
	var whole, reply, l0, all, wcpu, lcpu []time.Duration
	var wreq, lreq []float64
	served := f.requests
	if served == nil {
		served = func() float64 { return 0 }
	}
	for r := range rounds {
		c0, q0 := proccpu.Used(), served()
		w, err := f.whole(ctx, r == 0)
		if err != nil {
			return TierRow{}, 0, err
		}
		c1, q1 := proccpu.Used(), served()
		rp, a, b, _, err := f.stream(ctx, r == 0, nil)
		if err != nil {
			return TierRow{}, 0, err
		}
		c2, q2 := proccpu.Used(), served()
		whole, reply, l0, all = append(whole, w), append(reply, rp), append(l0, a), append(all, b)
		wcpu, lcpu = append(wcpu, c1-c0), append(lcpu, c2-c1)
		wreq, lreq = append(wreq, q1-q0), append(lreq, q2-q1)
	}
	row := TierRow{Tier: name, Whole: median(whole), Reply: median(reply), Layer0: median(l0), All: median(all),
		WholeCPU: median(wcpu), LayersCPU: median(lcpu), WholeRequests: median(wreq), LayersRequests: median(lreq)}
	row.Ratio = float64(row.Layer0) / float64(row.All)
	return row, row.Whole / time.Duration(f.layers), nil
}

// ttft models a forward pass over the prefix whose layers take perLayer×k
// each, for k of 1 (load ≈ compute), 0.1 and 10: whole = load, then every
// layer; layerwise = each layer once it is in place. Compute is a sleep:
// the GPU's work, which leaves the CPU to the loads.
func (f *fixture) ttft(ctx context.Context, name string, perLayer time.Duration, rounds int) ([]TTFTRow, error) {
	var rows []TTFTRow
	for _, c := range []struct {
		name   string
		factor float64
	}{{"load ≈ compute", 1}, {"load ≪ compute", 10}, {"load ≫ compute", 0.1}} {
		pl := time.Duration(float64(perLayer) * c.factor)
		compute := func() { time.Sleep(pl) }
		var whole, lw []time.Duration
		for range rounds {
			load, err := f.whole(ctx, false)
			if err != nil {
				return rows, err
			}
			start := time.Now()
			for range f.layers {
				compute()
			}
			whole = append(whole, load+time.Since(start))
			_, _, _, done, err := f.stream(ctx, false, compute)
			if err != nil {
				return rows, err
			}
			lw = append(lw, done)
		}
		row := TTFTRow{Tier: name, Case: c.name, PerLayer: pl, Whole: median(whole), Layerwise: median(lw)}
		row.Speedup = float64(row.Whole) / float64(row.Layerwise)
		rows = append(rows, row)
	}
	return rows, nil
}

// ram compares the two retrieve operations on the prefix in RAM, in ten
// batches of 20,000 requests each, alternating which goes first.
func (f *fixture) ram(ctx context.Context) (RAMRow, error) {
	if err := f.settle(ctx); err != nil {
		return RAMRow{}, err
	}
	slots := make([]engine.Slot, 0, len(f.keys))
	today := func() error {
		s, id, err := f.eng.PrepareRetrieve(ctx, f.keys, leaseTTL, slots[:0])
		if err == nil && len(s) != len(f.keys) {
			err = fmt.Errorf("layerwise: RAM retrieve got %d chunks", len(s))
		}
		f.eng.Release(id)
		return err
	}
	layered := func() error {
		s, id, err := f.eng.PrepareRetrieveLayers(ctx, f.keys, engine.Layers{}, leaseTTL, slots[:0])
		if err == nil && len(s) != len(f.keys) {
			err = fmt.Errorf("layerwise: RAM retrieve got %d chunks", len(s))
		}
		if err == nil {
			_, _, err = f.eng.LayerWait(ctx, id, 0)
		}
		f.eng.Release(id)
		return err
	}
	const batch = 20000
	var a, b []time.Duration
	type op struct {
		fn  func() error
		out *[]time.Duration
	}
	for i := range 10 {
		order := []op{{today, &a}, {layered, &b}}
		if i%2 == 1 { // neither always runs first
			order[0], order[1] = order[1], order[0]
		}
		for _, m := range order {
			start := time.Now()
			for range batch {
				if err := m.fn(); err != nil {
					return RAMRow{}, err
				}
			}
			*m.out = append(*m.out, time.Since(start)/batch)
		}
	}
	row := RAMRow{Today: median(a), Layerwise: median(b)}
	row.Ratio = float64(row.Layerwise) / float64(row.Today)
	var err error
	row.LoadToday, row.LoadLayerwise, err = f.ramLoads(ctx)
	row.LoadRatio = float64(row.LoadLayerwise) / float64(row.LoadToday)
	return row, err
}

// ramLoads times loading the RAM-held prefix into other memory layer by
// layer, as the connector copies it to the GPU: after PrepareRetrieve,
// and after PrepareRetrieveLayers with the waits its answers call for
// (none past the first for a RAM hit). The copies are the same, so the
// difference is the operations'. Medians of 21 alternating rounds.
func (f *fixture) ramLoads(ctx context.Context) (today, layered time.Duration, err error) {
	dst := make([][]byte, len(f.keys))
	for i := range dst {
		dst[i] = make([]byte, len(f.data[i]))
	}
	load := func(layerwise bool) error {
		var slots []engine.Slot
		var id engine.LeaseID
		var err error
		if layerwise {
			slots, id, err = f.eng.PrepareRetrieveLayers(ctx, f.keys, engine.Layers{}, leaseTTL, nil)
		} else {
			slots, id, err = f.eng.PrepareRetrieve(ctx, f.keys, leaseTTL, nil)
		}
		defer f.eng.Release(id)
		ready := f.layers
		if layerwise {
			ready = 0
		}
		for layer := 0; err == nil && layer < f.layers; layer++ {
			if ready <= layer {
				if _, ready, err = f.eng.LayerWait(ctx, id, layer); err != nil {
					return err
				}
			}
			err = f.copyLayer(slots, dst, layer)
		}
		return err
	}
	var ta, tb []time.Duration
	for i := range 21 {
		for j := range 2 {
			layerwise, out := (i+j)%2 == 1, &ta
			if layerwise {
				out = &tb
			}
			start := time.Now()
			if err := load(layerwise); err != nil {
				return 0, 0, err
			}
			*out = append(*out, time.Since(start))
		}
	}
	return median(ta), median(tb), nil
}

// copyLayer copies layer's K and V ranges of every slot into dst.
func (f *fixture) copyLayer(slots []engine.Slot, dst [][]byte, layer int) error {
	a := f.eng.Arena()
	for i, s := range slots {
		src, err := a.Region(int64(s.Offset), int(s.Len))
		if err != nil {
			return err
		}
		span := len(src) / (2 * f.layers)
		for part := range 2 {
			from := (part*f.layers + layer) * span
			copy(dst[i][from:from+span], src[from:from+span])
		}
	}
	return nil
}

func median[T time.Duration | float64](d []T) T {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// Print writes the result as the tables of docs/layerwise.md.
func (r Result) Print(w io.Writer) {
	fmt.Fprintf(w, "prefix: %d chunks of %d MiB, format %s\n\n", r.Chunks, r.ChunkBytes>>20, r.Format)
	fmt.Fprintf(w, "%-9s %10s %10s %10s %10s %8s %10s %10s\n", "tier", "whole", "reply", "layer 0", "all", "l0/all", "cpu whole", "cpu all")
	for _, t := range r.Tiers {
		fmt.Fprintf(w, "%-9s %10s %10s %10s %10s %8s %10s %10s\n", t.Tier, ms(t.Whole), ms(t.Reply), ms(t.Layer0), ms(t.All),
			fmt.Sprintf("1/%.0f", 1/t.Ratio), ms(t.WholeCPU), ms(t.LayersCPU))
	}
	for _, t := range r.Tiers {
		if t.WholeRequests > 0 {
			fmt.Fprintf(w, "%-9s requests to the peer per load: whole %.0f, by layers %.0f\n", t.Tier, t.WholeRequests, t.LayersRequests)
		}
	}
	fmt.Fprintf(w, "\n%-9s %-16s %10s %10s %10s %8s\n", "tier", "case", "per layer", "whole", "layerwise", "speedup")
	for _, t := range r.TTFT {
		fmt.Fprintf(w, "%-9s %-16s %10s %10s %10s %7.2fx\n", t.Tier, t.Case, ms(t.PerLayer), ms(t.Whole), ms(t.Layerwise), t.Speedup)
	}
	fmt.Fprintf(w, "\nRAM hit, operations only: PREPARE_RETRIEVE %s, PREPARE_RETRIEVE_LAYERS + LAYER_WAIT %s (%.3fx)\n",
		r.RAM.Today, r.RAM.Layerwise, r.RAM.Ratio)
	fmt.Fprintf(w, "RAM hit, prefix copied out layer by layer: PREPARE_RETRIEVE %s, PREPARE_RETRIEVE_LAYERS %s (%.3fx)\n",
		ms(r.RAM.LoadToday), ms(r.RAM.LoadLayerwise), r.RAM.LoadRatio)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }
