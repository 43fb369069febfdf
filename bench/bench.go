// Package bench measures kvtier next to baselines taken in the same run,
// because the machines it runs on are noisy and only ratios carry over:
// RAM-tier store and retrieve against a plain memcpy of the same bytes,
// disk-tier write and read against raw O_DIRECT sequential I/O in the same
// directory, Lookup latency and the cost of each key hash; through a daemon
// served in the same process, the local protocol (shared arena) against
// memcpy, LOOKUPs from concurrent clients, and the TCP protocol against a
// plain loopback TCP stream; every remote-tier codec; and each remote
// tier against its backend's own client library on the same server.
//
// `kvtier bench` parses its flags into Options, calls Run and prints the
// Report. Every tier and protocol measurement reads back what it stored
// and compares it, so a fast wrong answer cannot pass as a result.
package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"kvtier/chunk"
	"kvtier/codec"
	"kvtier/engine"
	"kvtier/kvformat"
	"kvtier/tier/disk"
	"kvtier/tier/remote"
)

// Options say what to measure; each is a flag of `kvtier bench`. The
// chunk shape defaults (in the flags) to one Llama-3-8B chunk: 32 layers,
// 8 KV heads, head dim 128, bf16, 256 tokens.
type Options struct {
	// The chunk's shape: KV of Layers × Heads × HeadDim values of DType
	// (a kvformat dtype name) for each of Tokens tokens, keys and values.
	Layers, Heads, HeadDim, Tokens int
	DType                          string
	// Chunks are stored and read per round; the best of Rounds is reported.
	Chunks, Rounds int
	// Dir holds the disk measurements; it must be on a real disk, since
	// tmpfs refuses O_DIRECT.
	Dir string
	// SkipDisk, SkipDaemon and SkipCodecs leave those measurements out.
	SkipDisk   bool
	SkipDaemon bool
	SkipCodecs bool
	// Remotes are remote tier URLs to measure against their backends' own
	// client libraries, RemoteChunks chunks each.
	Remotes      []string
	RemoteChunks int
	// Socket, when set, measures LOOKUPs against the daemon serving this
	// local socket (another process) instead of one served in this process.
	Socket string
	// LookupsOnly measures the lookup rates and their baselines alone.
	LookupsOnly bool
}

// Report is what Run measured, and what `kvtier bench --json` prints.
// Throughputs are GB/s (1e9 bytes per second); each ratio divides by the
// baseline measured in the same run.
type Report struct {
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

	LookupsOnly bool `json:"lookups_only,omitempty"` // --lookups-only: only Daemon's lookup rates were measured

	Daemon *DaemonReport   `json:"daemon,omitempty"`
	Remote []*RemoteReport `json:"remote,omitempty"`
	Codecs []codec.Report  `json:"codecs,omitempty"`
}

// Run takes every measurement f asks for, writing what it is doing to
// progress. It checks that every byte read back is the byte stored.
func Run(ctx context.Context, f Options, progress io.Writer) (*Report, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if f.Chunks <= 0 || f.Rounds <= 0 {
		return nil, fmt.Errorf("--chunks and --rounds must be positive")
	}
	dt, err := kvformat.ParseDType(f.DType)
	if err != nil {
		return nil, fmt.Errorf("--dtype: %w", err)
	}
	chunkBytes := 2 * f.Layers * f.Heads * f.HeadDim * dt.Size() * f.Tokens
	if chunkBytes <= 0 {
		return nil, fmt.Errorf("chunk shape gives %d bytes", chunkBytes)
	}
	r := &Report{ChunkBytes: chunkBytes, Chunks: f.Chunks, LookupsOnly: f.LookupsOnly}
	if f.LookupsOnly {
		return r, benchLookupsOnly(ctx, f, r, progress)
	}
	fmt.Fprintf(progress, "chunk %d bytes × %d chunks, best of %d rounds\n", chunkBytes, f.Chunks, f.Rounds)

	src, err := mapBuffers(f.Chunks, chunkBytes)
	if err != nil {
		return nil, err
	}
	dst, err := mapBuffers(f.Chunks, chunkBytes)
	if err != nil {
		return nil, err
	}
	fillPattern(src)

	fmt.Fprintln(progress, "memcpy baseline, RAM tier ...")
	if err := benchRAM(ctx, f, r, src, dst); err != nil {
		return nil, err
	}
	if !f.SkipDisk {
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
	if !f.SkipDaemon {
		if err := benchDaemon(ctx, f, r, src, dst, progress); err != nil {
			return nil, fmt.Errorf("daemon bench: %w", err)
		}
	}
	for _, u := range f.Remotes {
		fmt.Fprintf(progress, "remote tier %s ...\n", remote.Redact(u))
		rep, err := benchRemote(ctx, u, src[0], f.RemoteChunks)
		if err != nil {
			return nil, fmt.Errorf("remote bench: %w", err)
		}
		r.Remote = append(r.Remote, rep)
	}
	if !f.SkipCodecs {
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
func benchRAM(ctx context.Context, f Options, r *Report, src, dst [][]byte) error {
	total := int64(f.Chunks * r.ChunkBytes)
	e, err := engine.Open(engine.Options{ChunkSize: f.Tokens, RAMBytes: total + int64(r.ChunkBytes), Policy: "LRU", Prefault: true})
	if err != nil {
		return err
	}
	defer e.Close()
	scope := chunk.Scope{Model: "bench", WorldSize: 1, Format: f.DType}
	// Each round times a plain copy of src into dst, a store of src under
	// fresh keys (one copy into the arena, evicting the previous round) and
	// a retrieve into dst (one copy out), back to back on the same buffers.
	// Round 0 only warms up: first-touch page faults are not measured.
	for round := range f.Rounds + 1 {
		memcpy := bestOf(1, total, func() error {
			for i := range src {
				copy(dst[i], src[i])
			}
			return nil
		})
		req := engine.Request{Scope: scope, Tokens: benchTokens(f.Chunks*f.Tokens, uint32(round))}
		var err error
		store := bestOf(1, total, func() error {
			var n int
			if n, err = e.Store(ctx, req, src); err == nil && n != f.Chunks {
				err = fmt.Errorf("stored %d of %d chunks", n, f.Chunks)
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("RAM bench: store: %w", err)
		}
		clearChunks(dst) // so the check after the last round sees retrieved bytes
		retrieve := bestOf(1, total, func() error {
			var got engine.Retrieved
			if got, err = e.Retrieve(ctx, req, dst); err == nil && got.Chunks != f.Chunks {
				err = fmt.Errorf("retrieved %d of %d chunks", got.Chunks, f.Chunks)
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
func benchDisk(ctx context.Context, f Options, r *Report, src, dst [][]byte) error {
	if err := os.MkdirAll(f.Dir, 0o755); err != nil {
		return err
	}
	rawDir, err := os.MkdirTemp(f.Dir, "raw-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(rawDir)
	tierDir, err := os.MkdirTemp(f.Dir, "tier-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tierDir)

	total := int64(f.Chunks * r.ChunkBytes)
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
	for round := range uint32(f.Rounds) {
		w, _, err := disk.RawDirectIO(rawDir, src) // writes from src's pages
		var rd float64
		if err == nil {
			_, rd, err = disk.RawDirectIO(rawDir, dst) // reads into dst's pages
		}
		if err != nil {
			return fmt.Errorf("raw O_DIRECT baseline in %s: %w", f.Dir, err)
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
