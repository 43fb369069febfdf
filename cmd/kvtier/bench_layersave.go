package main

import (
	"github.com/spf13/cobra"

	"kvtier/bench/layersave"
)

func benchLayersaveCmd() *cobra.Command {
	var asJSON bool
	o := layersave.Defaults(".kvtier-layersave")
	cmd := &cobra.Command{
		Use:   "layersave",
		Short: "measure per-layer saves against whole-chunk write-behind (docs/layerwise.md)",
		Long: `layersave saves chunks into a fresh disk tier the way the vLLM connector does
(PREPARE_STORE, each layer copied into the slots, COMMIT_STORE), alternating round by
round between writing each layer to disk as its STORE_LAYER notice arrives and writing
whole chunks after the commit. It reports the time from the commit until every chunk is
durable on disk, from the first layer until then, the write throughput and the CPU
time, once with no compute between layers and once with a compute time per layer equal
to a whole-chunk warm-up save's write time (commit to durable) over the layers.
With --redis the chunks go to a Redis tier instead of the disk tier, on a redis-server
the benchmark starts on loopback (redis-server must be on PATH): durable is then
stored in Redis, and the server's CPU time is reported too.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := layersave.Run(cmd.Context(), o, cmd.ErrOrStderr())
			return printReport(cmd, r, err, asJSON)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.Dir, "dir", o.Dir, "directory for the disk tier (a real disk: tmpfs refuses O_DIRECT)")
	chunkShapeFlags(cmd, &o.Layers, &o.KVHeads, &o.HeadDim, &o.ChunkTokens)
	fl.IntVar(&o.Chunks, "chunks", o.Chunks, "chunks per save")
	fl.IntVar(&o.Rounds, "rounds", o.Rounds, "rounds per figure (the median is reported)")
	fl.BoolVar(&o.Redis, "redis", false, "save into a Redis tier on a redis-server started on loopback, not the disk tier")
	fl.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
