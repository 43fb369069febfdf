package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"kvtier/codec"
	"kvtier/tier/remote"
	"os"
	"runtime/pprof"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"kvtier/chunk"
	"kvtier/engine"
	"kvtier/kvformat"
	"kvtier/tier/disk"
)

// benchFlags hold `kvtier bench` options. The default chunk is one
// Llama-3-8B chunk: 32 layers, 8 KV heads, head dim 128, bf16, 256 tokens.
type benchFlags struct {
	layers, heads, headDim, tokens int
	dtype                          string
	chunks, rounds                 int
	dir                            string
	skipDisk                       bool
	skipDaemon                     bool
	skipCodecs                     bool
	remotes                        []string
	remoteChunks                   int
	cpuProfile                     string
	socket                         string
	json                           bool
}

// benchReport is what `kvtier bench --json` prints. Throughputs are GB/s
// (1e9 bytes per second); each ratio divides by the baseline measured in
// the same run.
type benchReport struct {
	ChunkBytes int `json:"chunk_bytes"`
	Chunks     int `json:"chunks"`

	MemcpyGBps       float64 `json:"memcpy_gbps"`
	RAMStoreGBps     float64 `json:"ram_store_gbps"`
	RAMRetrieveGBps  float64 `json:"ram_retrieve_gbps"`
	RAMStoreRatio    float64 `json:"ram_store_ratio"`
	RAMRetrieveRatio float64 `json:"ram_retrieve_ratio"`

	DiskDirectIO     bool    `json:"disk_direct_io"`
	RawWriteGBps     float64 `json:"raw_odirect_write_gbps,omitempty"`
	RawReadGBps      float64 `json:"raw_odirect_read_gbps,omitempty"`
	DiskWriteGBps    float64 `json:"disk_write_gbps,omitempty"`
	DiskReadGBps     float64 `json:"disk_read_gbps,omitempty"`
	DiskWriteRatio   float64 `json:"disk_write_ratio,omitempty"`
	DiskReadRatio    float64 `json:"disk_read_ratio,omitempty"`
	LookupTokens     int     `json:"lookup_tokens"`
	LookupMeanMicros float64 `json:"lookup_mean_us"`
	LookupP99Micros  float64 `json:"lookup_p99_us"`
	HashNsPerChunk   float64 `json:"hash_kvtier_ns_per_chunk"`
	VLLMNsPerBlock   float64 `json:"hash_vllm_ns_per_block"`
	SGLangNsPerPage  float64 `json:"hash_sglang_ns_per_page"`
	HashChunkTokens  int     `json:"hash_chunk_tokens"`
	VLLMBlockTokens  int     `json:"hash_vllm_block_tokens"`
	SGLangPageTokens int     `json:"hash_sglang_page_tokens"`

	Daemon *daemonReport   `json:"daemon,omitempty"`
	Remote []*remoteReport `json:"remote,omitempty"`
	Codecs []codec.Report  `json:"codecs,omitempty"`
}

func benchCmd() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "measure the RAM and disk tiers, lookup and hashing against same-run baselines",
		Long: `bench measures kvtier's tiers next to a baseline measured in the same run:
RAM-tier store and retrieve against a plain memcpy of the same bytes, disk-tier
write and read against raw O_DIRECT sequential I/O of the same bytes in the same
directory, the latency of Lookup for a 32,768-token prompt, and the cost of each
hash; then, through a daemon served in the same process, store and retrieve over
the local protocol (shared arena) against memcpy, LOOKUPs per second from 4
concurrent clients, and store and retrieve over the TCP protocol against a plain
loopback TCP stream; every remote-tier codec on synthetic KV of the chunk's
shape; and, for each --remote URL, the remote tier's put and get against the
backend's own client library on the same server. Machines are noisy: read the ratios, not the absolute figures.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.cpuProfile != "" {
				out, err := os.Create(f.cpuProfile)
				if err != nil {
					return err
				}
				defer out.Close()
				if err := pprof.StartCPUProfile(out); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			r, err := runBench(cmd.Context(), f, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if f.json {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(r)
			}
			printBench(cmd.OutOrStdout(), r)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&f.layers, "layers", 32, "model layers")
	fl.IntVar(&f.heads, "kv-heads", 8, "KV heads")
	fl.IntVar(&f.headDim, "head-dim", 128, "head dimension")
	fl.IntVar(&f.tokens, "chunk-tokens", 256, "tokens per chunk")
	fl.StringVar(&f.dtype, "dtype", "bfloat16", "KV dtype")
	fl.IntVar(&f.chunks, "chunks", 16, "chunks per measured round")
	fl.IntVar(&f.rounds, "rounds", 3, "measured rounds (the best is reported)")
	fl.StringVar(&f.dir, "dir", ".kvtier-bench", "directory for the disk measurements (use a real disk: tmpfs refuses O_DIRECT)")
	fl.BoolVar(&f.skipDisk, "skip-disk", false, "skip the disk measurements")
	fl.BoolVar(&f.skipDaemon, "skip-daemon", false, "skip the measurements through the daemon's protocols")
	fl.BoolVar(&f.skipCodecs, "skip-codecs", false, "skip the codec measurements")
	fl.StringArrayVar(&f.remotes, "remote", nil, "also measure this remote tier URL (redis://…, s3://…) against its raw client library (repeatable)")
	fl.IntVar(&f.remoteChunks, "remote-chunks", 8, "chunks per remote measurement")
	fl.StringVar(&f.socket, "socket", "", "measure LOOKUPs against the daemon already serving this local socket (another process) instead of one in this process")
	fl.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	fl.BoolVar(&f.json, "json", false, "print JSON")
	return cmd
}

func runBench(ctx context.Context, f benchFlags, progress io.Writer) (*benchReport, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if f.chunks <= 0 || f.rounds <= 0 {
		return nil, fmt.Errorf("--chunks and --rounds must be positive")
	}
	dt, err := kvformat.ParseDType(f.dtype)
	if err != nil {
		return nil, fmt.Errorf("--dtype: %w", err)
	}
	chunkBytes := 2 * f.layers * f.heads * f.headDim * dt.Size() * f.tokens
	if chunkBytes <= 0 {
		return nil, fmt.Errorf("chunk shape gives %d bytes", chunkBytes)
	}
	r := &benchReport{ChunkBytes: chunkBytes, Chunks: f.chunks}
	fmt.Fprintf(progress, "chunk %d bytes × %d chunks, best of %d rounds\n", chunkBytes, f.chunks, f.rounds)

	src, err := mapBuffers(f.chunks, chunkBytes)
	if err != nil {
		return nil, err
	}
	dst, err := mapBuffers(f.chunks, chunkBytes)
	if err != nil {
		return nil, err
	}
	fillPattern(src)

	fmt.Fprintln(progress, "memcpy baseline, RAM tier ...")
	if err := benchRAM(ctx, f, r, src, dst); err != nil {
		return nil, err
	}
	if !f.skipDisk {
		fmt.Fprintln(progress, "raw O_DIRECT baseline, disk tier ...")
		if err := benchDisk(ctx, f, r, src, dst); err != nil {
			return nil, err
		}
	}
	fmt.Fprintln(progress, "lookup, hashes ...")
	if err := benchLookup(ctx, r); err != nil {
		return nil, err
	}
	benchHashes(r)
	if !f.skipDaemon {
		if err := benchDaemon(ctx, f, r, src, dst, progress); err != nil {
			return nil, fmt.Errorf("daemon bench: %w", err)
		}
	}
	for _, u := range f.remotes {
		fmt.Fprintf(progress, "remote tier %s ...\n", remote.Redact(u))
		rep, err := benchRemote(ctx, u, src[0], f.remoteChunks)
		if err != nil {
			return nil, fmt.Errorf("remote bench: %w", err)
		}
		r.Remote = append(r.Remote, rep)
	}
	if !f.skipCodecs {
		fmt.Fprintln(progress, "codecs ...")
		if r.Codecs, err = benchCodecs(f, dt); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// mapBuffers returns n page-aligned buffers of size bytes outside the Go
// heap, pre-faulted, like the arena's memory.
func mapBuffers(n, size int) ([][]byte, error) {
	bufs := make([][]byte, n)
	for i := range bufs {
		b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
		if err != nil {
			return nil, fmt.Errorf("mmap %d bytes: %w", size, err)
		}
		bufs[i] = b
	}
	return bufs, nil
}

func fillPattern(bufs [][]byte) {
	x := uint64(0x9E3779B97F4A7C15)
	for _, b := range bufs {
		for i := 0; i+8 <= len(b); i += 8 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			for j := range 8 {
				b[i+j] = byte(x >> (8 * j))
			}
		}
	}
}

// bestOf runs fn rounds times and returns the best throughput in GB/s.
func bestOf(rounds int, bytes int64, fn func() error) float64 {
	best := 0.0
	for range rounds {
		start := time.Now()
		if err := fn(); err != nil {
			return 0
		}
		if gbps := float64(bytes) / time.Since(start).Seconds() / 1e9; gbps > best {
			best = gbps
		}
	}
	return best
}

func benchTokens(n int, salt uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(i)*2654435761 + salt
	}
	return t
}

// benchRAM stores the chunks through the engine (one copy into the arena)
// and retrieves them (one copy out), each round under fresh keys so that
// stores are never no-ops.
func benchRAM(ctx context.Context, f benchFlags, r *benchReport, src, dst [][]byte) error {
	total := int64(f.chunks * r.ChunkBytes)
	e, err := engine.Open(engine.Options{ChunkSize: f.tokens, RAMBytes: total + int64(r.ChunkBytes), Policy: "LRU", Prefault: true})
	if err != nil {
		return err
	}
	defer e.Close()
	scope := chunk.Scope{Model: "bench", WorldSize: 1, Format: f.dtype}
	// Each round times a plain copy of src into dst, a store of src under
	// fresh keys (one copy into the arena, evicting the previous round) and
	// a retrieve into dst (one copy out), back to back on the same buffers.
	// Round 0 only warms up: first-touch page faults are not measured.
	for round := range f.rounds + 1 {
		memcpy := bestOf(1, total, func() error {
			for i := range src {
				copy(dst[i], src[i])
			}
			return nil
		})
		req := engine.Request{Scope: scope, Tokens: benchTokens(f.chunks*f.tokens, uint32(round))}
		var err error
		store := bestOf(1, total, func() error {
			var n int
			if n, err = e.Store(ctx, req, src); err == nil && n != f.chunks {
				err = fmt.Errorf("stored %d of %d chunks", n, f.chunks)
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("RAM bench: store: %w", err)
		}
		clearChunks(dst) // so the check after the last round sees retrieved bytes
		retrieve := bestOf(1, total, func() error {
			var got engine.Retrieved
			if got, err = e.Retrieve(ctx, req, dst); err == nil && got.Chunks != f.chunks {
				err = fmt.Errorf("retrieved %d of %d chunks", got.Chunks, f.chunks)
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("RAM bench: retrieve: %w", err)
		}
		if round > 0 {
			r.MemcpyGBps = max(r.MemcpyGBps, memcpy)
			r.RAMStoreGBps = max(r.RAMStoreGBps, store)
			r.RAMRetrieveGBps = max(r.RAMRetrieveGBps, retrieve)
		}
	}
	if err := sameChunks("RAM bench", src, dst); err != nil {
		return err
	}
	r.RAMStoreRatio = r.RAMStoreGBps / r.MemcpyGBps
	r.RAMRetrieveRatio = r.RAMRetrieveGBps / r.MemcpyGBps
	return nil
}

// benchDisk measures raw O_DIRECT sequential I/O and then the disk tier's
// Put and Get of the same buffers in the same directory.
func benchDisk(ctx context.Context, f benchFlags, r *benchReport, src, dst [][]byte) error {
	if err := os.MkdirAll(f.dir, 0o755); err != nil {
		return err
	}
	rawDir, err := os.MkdirTemp(f.dir, "raw-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(rawDir)
	tierDir, err := os.MkdirTemp(f.dir, "tier-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tierDir)

	total := int64(f.chunks * r.ChunkBytes)
	d, err := disk.Open(tierDir, disk.Options{Capacity: 2*total + 64<<20})
	if err != nil {
		return err
	}
	defer d.Close()
	r.DiskDirectIO = d.DirectIO()
	// Each round measures the baseline and the tier back to back on the
	// same buffers: raw O_DIRECT writes of src then one fdatasync, raw reads
	// into dst, then the tier's Puts of src and Gets into dst. Best of rounds.
	var failed error
	for round := range uint32(f.rounds) {
		w, _, err := disk.RawDirectIO(rawDir, src) // writes from src's pages
		var rd float64
		if err == nil {
			_, rd, err = disk.RawDirectIO(rawDir, dst) // reads into dst's pages
		}
		if err != nil {
			return fmt.Errorf("raw O_DIRECT baseline in %s: %w", f.dir, err)
		}
		r.RawWriteGBps, r.RawReadGBps = max(r.RawWriteGBps, w/1e9), max(r.RawReadGBps, rd/1e9)
		r.DiskWriteGBps = max(r.DiskWriteGBps, bestOf(1, total, func() error {
			for i := range src {
				if err := d.Put(ctx, benchKey(round, i), src[i]); err != nil {
					failed = err
					return err
				}
			}
			return nil
		}))
		clearChunks(dst)
		r.DiskReadGBps = max(r.DiskReadGBps, bestOf(1, total, func() error {
			for i := range dst {
				if _, err := d.Get(ctx, benchKey(round, i), dst[i]); err != nil {
					failed = err
					return err
				}
			}
			return nil
		}))
	}
	if failed != nil {
		return fmt.Errorf("disk bench: %w", failed)
	}
	if err := sameChunks("disk bench", src, dst); err != nil {
		return err
	}
	r.DiskWriteRatio = r.DiskWriteGBps / r.RawWriteGBps
	r.DiskReadRatio = r.DiskReadGBps / r.RawReadGBps
	return nil
}

func clearChunks(bufs [][]byte) {
	for _, b := range bufs {
		clear(b)
	}
}

// sameChunks checks that what a bench read back is what it wrote.
func sameChunks(what string, src, dst [][]byte) error {
	for i := range src {
		if !slices.Equal(src[i], dst[i]) {
			return fmt.Errorf("%s: chunk %d read back different bytes", what, i)
		}
	}
	return nil
}

func benchKey(round uint32, i int) chunk.Key {
	var k chunk.Key
	k.Scope = 0xbe4c
	binary.LittleEndian.PutUint32(k.Hash[0:], round)
	binary.LittleEndian.PutUint64(k.Hash[4:], uint64(i))
	return k
}
