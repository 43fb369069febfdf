package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"kvtier/chunk"
	"kvtier/engine"
	"kvtier/replay"
	"kvtier/router/index"
	"kvtier/tier/disk"
	"kvtier/tier/policy"
)

type replayFlags struct {
	trace         string
	policy        string
	ramFrac       float64
	diskFrac      float64
	diskDir       string
	bytesPerToken int
	requests      int
	plot          string
	sweep         string
	noProgress    bool
	json          bool
	synth         string
	seed          uint64
	synthRequests int
	router        routerFlags
	nodes         nodesFlags
}

func replayCmd() *cobra.Command {
	var f replayFlags
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "replay a Mooncake-format request trace through the engine and compare policies with OPT",
		Long: `replay drives a request trace (Mooncake's JSON-lines format, one 512-token
block per hash id) through the real engine: a RAM tier and a disk tier sized as
fractions of the trace's distinct blocks, with KV of --bytes-per-token bytes per
token so the run fits this machine. It prints the hit rate per tier and the bytes
moved, then the block hit rate every eviction policy and Belady's optimum (OPT,
offline) reach in simulation at the same RAM capacity. --plot draws hit rate
against capacity for every policy and OPT (simulated) as an SVG chart.

With --router it instead routes the trace over --pods simulated vLLM pods, each
with an LRU GPU prefix cache of --gpu-tokens that publishes vLLM's KV events
into kvtier's router index, and compares routing by kvtier's prefix score
(alone, and traded against load) with round robin and least loaded: cache hit
rate and load balance.

With --nodes N it instead simulates N kvtier nodes, each with a RAM tier of
--ram and a disk tier of --disk (fractions of the distinct blocks, per node)
under --policy, and a shared remote store of --remote. Requests are routed by
the controller's --scorer over the nodes' holdings (alone, and traded against
load as with --router) and, as a baseline, round robin. It reports where prompt
tokens were found (local RAM, local disk, peer, remote, miss) without and with
P2P between the nodes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.nodes.nodes > 0 {
				return runNodesReplay(cmd.Context(), f, cmd.OutOrStdout(), cmd.ErrOrStderr())
			}
			if f.router.enabled {
				return runRouterReplay(cmd.Context(), f, cmd.OutOrStdout(), cmd.ErrOrStderr())
			}
			return runReplay(cmd.Context(), f, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.trace, "trace", "../shared/traces/conversation_trace.jsonl", "trace file (JSON lines)")
	fl.StringVar(&f.synth, "synth", "", "instead of --trace, generate a synthetic trace of this kind ("+strings.Join(replay.SynthKinds(), ", ")+")")
	fl.Uint64Var(&f.seed, "seed", 1, "--synth: generator seed (the same seed gives the same trace)")
	fl.IntVar(&f.synthRequests, "synth-requests", 12000, "--synth: requests to generate")
	fl.StringVar(&f.policy, "policy", policy.Default, "RAM-tier eviction policy for the engine run ("+strings.Join(policy.Names(), ", ")+")")
	fl.Float64Var(&f.ramFrac, "ram", 0.10, "RAM tier capacity as a fraction of the trace's distinct blocks")
	fl.Float64Var(&f.diskFrac, "disk", 0.30, "disk tier capacity as a fraction of the trace's distinct blocks (0 disables the disk tier)")
	fl.StringVar(&f.diskDir, "disk-dir", "", "directory for the disk tier (default: a temporary directory, removed afterwards)")
	fl.IntVar(&f.bytesPerToken, "bytes-per-token", 16, "KV bytes per token (a real Llama-3-8B stores 131072)")
	fl.IntVar(&f.requests, "requests", 0, "replay only the first N requests (0: all)")
	fl.StringVar(&f.plot, "plot", "", "write an SVG chart of hit rate against capacity to this file")
	fl.StringVar(&f.sweep, "sweep", "1,2,5,10,20,30,50", "capacities for --plot, in percent of distinct blocks")
	fl.BoolVar(&f.noProgress, "no-progress", false, "do not draw the progress bar")
	fl.BoolVar(&f.json, "json", false, "print the report as JSON")
	fl.BoolVar(&f.router.enabled, "router", false, "instead: route the trace over simulated vLLM pods and compare kvtier's KV-aware routing with round robin and least loaded")
	fl.IntVar(&f.router.pods, "pods", 4, "--router: simulated pods")
	fl.IntVar(&f.router.gpuTokens, "gpu-tokens", 200_000, "--router: each pod's GPU prefix cache, in tokens")
	fl.Float64Var(&f.router.prefillRate, "prefill-rate", 10_000, "--router, --nodes: a pod's (node's) prefill speed, tokens/s (service-time model)")
	fl.Float64Var(&f.router.decodeRate, "decode-rate", 50, "--router, --nodes: one request's decode speed, tokens/s (service-time model)")
	fl.Float64Var(&f.router.loadWeight, "load-weight", 0.05, "--router, --nodes: kvtier+load's cost of one request in flight, in shares of the prompt cached")
	fl.IntVar(&f.nodes.nodes, "nodes", 0, "instead: simulate this many kvtier nodes routed by the controller's scorer, without and with P2P")
	fl.Float64Var(&f.nodes.remote, "remote", 0, "--nodes: shared remote store capacity as a fraction of the trace's distinct blocks (0: none)")
	fl.StringVar(&f.nodes.scorer, "scorer", index.ScorerLongestPrefix, "--nodes: the controller's scorer ("+strings.Join(index.ScorerNames(), ", ")+")")
	return cmd
}

// replayReport is what `kvtier replay` prints.
type replayReport struct {
	Trace          string  `json:"trace"`
	Requests       int     `json:"requests"`
	BlockRefs      int     `json:"block_refs"`
	DistinctBlocks int     `json:"distinct_blocks"`
	BytesPerToken  int     `json:"bytes_per_token"`
	Policy         string  `json:"policy"`
	RAMBlocks      int     `json:"ram_capacity_blocks"`
	RAMBytes       int64   `json:"ram_capacity_bytes"`
	DiskBytes      int64   `json:"disk_capacity_bytes"`
	DiskDirect     bool    `json:"disk_direct_io"`
	Seconds        float64 `json:"seconds"`

	BlockHitRate   float64 `json:"block_hit_rate"`
	RAMBlockRate   float64 `json:"ram_block_hit_rate"`
	DiskBlockRate  float64 `json:"disk_block_hit_rate"`
	TokenHitRate   float64 `json:"token_hit_rate"`
	RAMTokenRate   float64 `json:"ram_token_hit_rate"`
	DiskTokenRate  float64 `json:"disk_token_hit_rate"`
	BytesStored    int64   `json:"bytes_stored"`
	BytesRetrieved int64   `json:"bytes_retrieved"`
	DiskWritten    uint64  `json:"disk_bytes_written"`
	DiskRead       uint64  `json:"disk_bytes_read"`
	DiskDropped    uint64  `json:"disk_writes_dropped"`

	// Simulated holds every policy, OPT and the infinite cache at the
	// RAM tier's capacity and, with a disk tier, at RAM plus disk capacity
	// (what a single cache of the hierarchy's size could do).
	Simulated      []simRow `json:"simulated"`
	SimulatedTotal []simRow `json:"simulated_ram_plus_disk,omitempty"`
	TotalBlocks    int      `json:"ram_plus_disk_capacity_blocks,omitempty"`
}

type simRow struct {
	Policy  string  `json:"policy"`
	HitRate float64 `json:"block_hit_rate"`
	OfOPT   float64 `json:"fraction_of_opt"`
}

func runReplay(ctx context.Context, f replayFlags, out, progress io.Writer) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if f.ramFrac <= 0 || f.diskFrac < 0 || f.bytesPerToken <= 0 {
		return fmt.Errorf("--ram and --bytes-per-token must be positive, --disk not negative")
	}
	reqs, err := loadTrace(&f)
	if err != nil {
		return err
	}
	if f.requests > 0 && f.requests < len(reqs) {
		reqs = reqs[:f.requests]
	}
	sum := replay.Summarize(reqs)
	blockBytes := int64(replay.BlockSize * f.bytesPerToken)
	r := &replayReport{Trace: f.trace, Requests: sum.Requests, BlockRefs: sum.BlockRefs,
		DistinctBlocks: sum.DistinctBlocks, BytesPerToken: f.bytesPerToken, Policy: strings.ToUpper(f.policy)}
	r.RAMBlocks = max(1, int(f.ramFrac*float64(sum.DistinctBlocks)))
	r.RAMBytes = int64(r.RAMBlocks) * blockBytes
	r.DiskBytes = int64(f.diskFrac*float64(sum.DistinctBlocks)) * (blockBytes + 4096) // room for each record's header block
	fmt.Fprintf(progress, "trace: %d requests, %d block references, %d distinct blocks\n", sum.Requests, sum.BlockRefs, sum.DistinctBlocks)

	if err := replayEngine(ctx, f, reqs, r, progress); err != nil {
		return err
	}
	if r.Simulated, err = simulateAt(reqs, r.RAMBlocks); err != nil {
		return err
	}
	if r.DiskBytes > 0 {
		r.TotalBlocks = r.RAMBlocks + int(f.diskFrac*float64(sum.DistinctBlocks))
		if r.SimulatedTotal, err = simulateAt(reqs, r.TotalBlocks); err != nil {
			return err
		}
	}
	if f.plot != "" {
		if err := plotSweep(reqs, f, sum.DistinctBlocks); err != nil {
			return err
		}
		fmt.Fprintf(progress, "chart written to %s\n", f.plot)
	}
	if f.json {
		return printJSON(out, r)
	}
	printReplay(out, r)
	return nil
}

// loadTrace reads --trace or, with --synth, generates a trace and names
// it in f.trace for the report.
func loadTrace(f *replayFlags) ([]replay.Request, error) {
	if f.synth == "" {
		return readTrace(f.trace)
	}
	reqs, err := replay.Synthesize(f.synth, f.seed, f.synthRequests)
	if err != nil {
		return nil, fmt.Errorf("--synth: %w", err)
	}
	f.trace = fmt.Sprintf("synth:%s:seed=%d:n=%d", strings.ToLower(f.synth), f.seed, f.synthRequests)
	return reqs, nil
}

func readTrace(path string) ([]replay.Request, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--trace: %w", err)
	}
	defer fh.Close()
	reqs, err := replay.ReadTrace(fh)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%s: no requests", path)
	}
	return reqs, nil
}

// replayEngine runs the trace through a real engine: arena-backed RAM tier
// and, unless disabled, the disk tier.
func replayEngine(ctx context.Context, f replayFlags, reqs []replay.Request, r *replayReport, progress io.Writer) error {
	opts := engine.Options{ChunkSize: replay.BlockSize, SaveUnfull: true, RAMBytes: r.RAMBytes, Policy: f.policy,
		DiskSync: disk.SyncNone}
	if f.diskFrac > 0 {
		dir := f.diskDir
		if dir == "" {
			tmp, err := os.MkdirTemp("", "kvtier-replay-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			dir = filepath.Join(tmp, "disk")
		}
		opts.DiskDir, opts.DiskBytes = dir, r.DiskBytes
	} else {
		r.DiskBytes = 0
	}
	// The replay must see every write land, as a long-running node would:
	// let stores wait for the disk queue instead of dropping.
	opts.Tier.WriteWait = time.Minute
	e, err := engine.Open(opts)
	if err != nil {
		return err
	}
	defer e.Close()
	c := newEngineCache(e, f.bytesPerToken)
	bar := newProgressBar(progress, !f.noProgress)
	start := time.Now()
	res, err := replay.Run(ctx, reqs, c, bar.update)
	bar.done()
	if err != nil {
		return err
	}
	// A chunk whose write to the disk tier failed and that has left RAM is
	// lost for the rest of the run: the figures stand, so say so and go on.
	if err := e.Manager().Flush(ctx); errors.Is(err, engine.ErrNotDurable) {
		fmt.Fprintf(os.Stderr, "kvtier replay: warning: %v\n", err)
	} else if err != nil {
		return err
	}
	r.Seconds = time.Since(start).Seconds()
	r.BlockHitRate = res.HitRate()
	r.TokenHitRate = float64(res.HitTokens) / float64(res.Tokens)
	r.RAMBlockRate = float64(c.tierBlocks[0]) / float64(res.BlockRefs)
	r.DiskBlockRate = float64(c.tierBlocks[1]) / float64(res.BlockRefs)
	r.RAMTokenRate = float64(c.tierTokens[0]) / float64(res.Tokens)
	r.DiskTokenRate = float64(c.tierTokens[1]) / float64(res.Tokens)
	r.BytesStored, r.BytesRetrieved = c.stored, c.retrieved
	stats, queues := e.Manager().Stats()
	if len(stats) > 1 {
		r.DiskWritten, r.DiskRead = stats[1].BytesWritten, stats[1].BytesRead
		r.DiskDropped = queues[0].Dropped
		if d, ok := e.Manager().Tiers()[1].(*disk.Tier); ok {
			r.DiskDirect = d.DirectIO()
		}
	}
	return nil
}

// simulateAt simulates every policy, OPT and the infinite cache at
// capacity blocks.
func simulateAt(reqs []replay.Request, capacity int) ([]simRow, error) {
	names := append(policy.Names(), replay.OPT, replay.Infinite)
	results, err := replay.Sweep(reqs, names, []int{capacity})
	if err != nil {
		return nil, err
	}
	opt := 0.0
	for _, res := range results {
		if res.Policy == replay.OPT {
			opt = res.HitRate()
		}
	}
	rows := make([]simRow, 0, len(results))
	for _, res := range results {
		row := simRow{Policy: res.Policy, HitRate: res.HitRate()}
		if opt > 0 {
			row.OfOPT = row.HitRate / opt
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func plotSweep(reqs []replay.Request, f replayFlags, distinct int) error {
	var caps []int
	for _, s := range strings.Split(f.sweep, ",") {
		pct, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || pct <= 0 {
			return fmt.Errorf("--sweep: %q is not a positive percentage", s)
		}
		caps = append(caps, max(1, int(pct/100*float64(distinct))))
	}
	names := append(policy.Names(), replay.OPT, replay.Infinite)
	results, err := replay.Sweep(reqs, names, caps)
	if err != nil {
		return err
	}
	fh, err := os.Create(f.plot)
	if err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	title := fmt.Sprintf("%s: block hit rate by capacity (simulated)", filepath.Base(f.trace))
	if err := replay.WriteSVG(fh, title, replay.SeriesOf(results, distinct)...); err != nil {
		fh.Close()
		return err
	}
	return fh.Close()
}

func printReplay(w io.Writer, r *replayReport) {
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	fmt.Fprintf(w, "trace %s: %d requests, %d block references, %d distinct blocks\n", r.Trace, r.Requests, r.BlockRefs, r.DistinctBlocks)
	fmt.Fprintf(w, "engine: %s policy, RAM %.0f MiB (%d blocks of 512 tokens × %d B/token)", r.Policy, mib(r.RAMBytes), r.RAMBlocks, r.BytesPerToken)
	if r.DiskBytes > 0 {
		fmt.Fprintf(w, ", disk %.0f MiB (O_DIRECT: %v)", mib(r.DiskBytes), r.DiskDirect)
	}
	fmt.Fprintf(w, ", %.1f s\n\n", r.Seconds)
	fmt.Fprintf(w, "block hit rate      %6.2f %%  (RAM %.2f %%, disk %.2f %%)\n", 100*r.BlockHitRate, 100*r.RAMBlockRate, 100*r.DiskBlockRate)
	fmt.Fprintf(w, "token hit rate      %6.2f %%  (RAM %.2f %%, disk %.2f %%)\n", 100*r.TokenHitRate, 100*r.RAMTokenRate, 100*r.DiskTokenRate)
	fmt.Fprintf(w, "bytes stored        %8.1f MiB, retrieved %.1f MiB\n", mib(r.BytesStored), mib(r.BytesRetrieved))
	if r.DiskBytes > 0 {
		fmt.Fprintf(w, "disk written        %8.1f MiB, read %.1f MiB, writes dropped %d\n", mib(int64(r.DiskWritten)), mib(int64(r.DiskRead)), r.DiskDropped)
	}
	fmt.Fprintf(w, "\nsimulated block hit rate (same policy code, capacity counted in blocks):\n")
	fmt.Fprintf(w, "  %-9s %22s", "policy", fmt.Sprintf("RAM: %d blocks", r.RAMBlocks))
	if r.SimulatedTotal != nil {
		fmt.Fprintf(w, " %28s", fmt.Sprintf("RAM+disk: %d blocks", r.TotalBlocks))
	}
	fmt.Fprintln(w)
	for i, s := range r.Simulated {
		fmt.Fprintf(w, "  %-9s %s", s.Policy, simCell(s))
		if r.SimulatedTotal != nil {
			fmt.Fprintf(w, "      %s", simCell(r.SimulatedTotal[i]))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\nthe engine's RAM tier (%s) hit %.2f %% of blocks; with the disk tier, %.2f %%\n", r.Policy, 100*r.RAMBlockRate, 100*r.BlockHitRate)
}

// simCell formats one simulated hit rate and its fraction of OPT.
func simCell(s simRow) string {
	if s.Policy == replay.OPT || s.Policy == replay.Infinite {
		return fmt.Sprintf("%6.2f %%%14s", 100*s.HitRate, "")
	}
	return fmt.Sprintf("%6.2f %% (%.3f of OPT)", 100*s.HitRate, s.OfOPT)
}

// engineCache adapts the engine to replay.Cache: Lookup also retrieves the
// hit chunks (moving their bytes, promoting disk hits into RAM), and Store
// saves the chunks after the retrieved prefix.
type engineCache struct {
	e             *engine.Engine
	scope         chunk.Scope
	bytesPerToken int
	hit           int // tokens retrieved by the last Lookup
	bufs          [][]byte
	tierTokens    [2]int64
	tierBlocks    [2]int64 // chunks are blocks: ChunkSize = replay.BlockSize
	stored        int64
	retrieved     int64
}

func newEngineCache(e *engine.Engine, bytesPerToken int) *engineCache {
	return &engineCache{e: e, bytesPerToken: bytesPerToken,
		scope: chunk.Scope{Model: "replay", WorldSize: 1, Format: fmt.Sprintf("%dB", bytesPerToken)}}
}

// buffers returns n chunk buffers of full size, reusing earlier ones.
func (c *engineCache) buffers(n int) [][]byte {
	for len(c.bufs) < n {
		c.bufs = append(c.bufs, make([]byte, c.e.ChunkSize()*c.bytesPerToken))
	}
	bufs := c.bufs[:n]
	for i := range bufs {
		bufs[i] = bufs[i][:cap(bufs[i])]
	}
	return bufs
}

func (c *engineCache) Lookup(tokens []uint32) (int, error) {
	req := engine.Request{Scope: c.scope, Tokens: tokens}
	hit, err := c.e.Lookup(req)
	if err != nil || hit.Chunks == 0 {
		c.hit = 0
		return 0, err
	}
	got, err := c.e.Retrieve(context.Background(), req, c.buffers(hit.Chunks))
	if err != nil {
		return 0, err
	}
	// Lookup charged each chunk to the tier serving it. Should Retrieve
	// return fewer chunks (RAM full), the shortfall comes off disk's share.
	ram := min(hit.ChunksByTier[0], got.Chunks)
	c.tierBlocks[0] += int64(ram)
	c.tierBlocks[1] += int64(got.Chunks - ram)
	c.tierTokens[0] += int64(min(hit.ByTier[0], got.Tokens))
	c.tierTokens[1] += int64(max(0, got.Tokens-hit.ByTier[0]))
	c.retrieved += int64(got.Tokens * c.bytesPerToken)
	c.hit = got.Tokens
	return got.Tokens, nil
}

func (c *engineCache) Store(tokens []uint32) error {
	if c.hit == len(tokens) {
		return nil // all cached, nothing to store
	}
	cs := c.e.ChunkSize()
	skip := c.hit - c.hit%cs
	first := skip / cs
	n := (len(tokens)+cs-1)/cs - first
	bufs := c.buffers(n)
	for i := range bufs {
		start := (first + i) * cs
		bufs[i] = bufs[i][:(min(start+cs, len(tokens))-start)*c.bytesPerToken]
		c.stored += int64(len(bufs[i]))
	}
	_, err := c.e.Store(context.Background(), engine.Request{Scope: c.scope, Tokens: tokens, Skip: skip}, bufs)
	return err
}
