package main

import (
	"encoding/json"
	"io"
	"os"
	"runtime/pprof"

	"github.com/spf13/cobra"

	"kvtier/bench"
)

func benchCmd() *cobra.Command {
	var f bench.Options
	var cpuProfile string
	var asJSON bool
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
			if cpuProfile != "" {
				stop, err := startCPUProfile(cpuProfile)
				if err != nil {
					return err
				}
				defer stop()
			}
			r, err := bench.Run(cmd.Context(), f, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), r)
			}
			r.Print(cmd.OutOrStdout())
			return nil
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&f.Layers, "layers", 32, "model layers")
	fl.IntVar(&f.Heads, "kv-heads", 8, "KV heads")
	fl.IntVar(&f.HeadDim, "head-dim", 128, "head dimension")
	fl.IntVar(&f.Tokens, "chunk-tokens", 256, "tokens per chunk")
	fl.StringVar(&f.DType, "dtype", "bfloat16", "KV dtype")
	fl.IntVar(&f.Chunks, "chunks", 16, "chunks per measured round")
	fl.IntVar(&f.Rounds, "rounds", 3, "measured rounds (the best is reported)")
	fl.StringVar(&f.Dir, "dir", ".kvtier-bench", "directory for the disk measurements (use a real disk: tmpfs refuses O_DIRECT)")
	fl.BoolVar(&f.SkipDisk, "skip-disk", false, "skip the disk measurements")
	fl.BoolVar(&f.SkipDaemon, "skip-daemon", false, "skip the measurements through the daemon's protocols")
	fl.BoolVar(&f.SkipCodecs, "skip-codecs", false, "skip the codec measurements")
	fl.StringArrayVar(&f.Remotes, "remote", nil, "also measure this remote tier URL (redis://…, s3://…) against its raw client library (repeatable)")
	fl.IntVar(&f.RemoteChunks, "remote-chunks", 8, "chunks per remote measurement")
	fl.StringVar(&f.Socket, "socket", "", "measure LOOKUPs against the daemon already serving this local socket (another process) instead of one in this process")
	fl.BoolVar(&f.LookupsOnly, "lookups-only", false, "measure only the LOOKUP and LOOKUP_BATCH rates and their round-trip baselines")
	fl.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	fl.BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(benchScaleCmd(), benchLayerwiseCmd(), benchLayersaveCmd(), benchPDLayerCmd())
	return cmd
}

// startCPUProfile writes a CPU profile to path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	out, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); out.Close() }, nil
}

// printReport prints the result of one of the layer benchmarks (layersave,
// layerwise, pdlayer): as JSON with --json, else as its tables.
func printReport(cmd *cobra.Command, r interface{ Print(io.Writer) }, err error, asJSON bool) error {
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(cmd.OutOrStdout(), r)
	}
	r.Print(cmd.OutOrStdout())
	return nil
}

// chunkShapeFlags adds the flags that set a layer benchmark's chunk shape.
func chunkShapeFlags(cmd *cobra.Command, layers, kvHeads, headDim, chunkTokens *int) {
	fl := cmd.Flags()
	fl.IntVar(layers, "layers", *layers, "layers per chunk")
	fl.IntVar(kvHeads, "kv-heads", *kvHeads, "KV heads")
	fl.IntVar(headDim, "head-dim", *headDim, "elements per head (fp16)")
	fl.IntVar(chunkTokens, "chunk-tokens", *chunkTokens, "tokens per chunk")
}

// printJSON writes v as indented JSON, the --json output of bench and replay.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
