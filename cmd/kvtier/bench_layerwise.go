package main

import (
	"github.com/spf13/cobra"

	"kvtier/bench/layerwise"
)

func benchLayerwiseCmd() *cobra.Command {
	var asJSON bool
	o := layerwise.Defaults(".kvtier-layerwise")
	cmd := &cobra.Command{
		Use:   "layerwise",
		Short: "measure layerwise retrieval: layer 0 against the whole prefix, TTFT, RAM hits (docs/layerwise.md)",
		Long: `layerwise stores a prefix of chunks in the disk tier (and in Redis with
--redis, in S3 with --s3, on a peer daemon's disk and in its RAM with --peer),
evicts it from RAM and reads it back both ways, alternating round by
round: PREPARE_RETRIEVE (every chunk promoted before the reply) and
PREPARE_RETRIEVE_LAYERS (reply at once, layers filled in the background). It
reports the time until layer 0 of every chunk is in place against the time
until every layer is; a modelled time to first token with a forward pass whose
layers take as long as the whole load divided by the layers (and 10x and 0.1x
that), computed after the load or overlapping it; and the cost of the two
operations on a prefix held in RAM.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := layerwise.Run(cmd.Context(), o, cmd.ErrOrStderr())
			return printReport(cmd, r, err, asJSON)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.Dir, "dir", o.Dir, "directory for the disk tier (a real disk: tmpfs refuses O_DIRECT)")
	fl.StringVar(&o.Redis, "redis", "", "also measure this Redis (redis://host:port/db); its chunks are written there")
	fl.StringVar(&o.S3, "s3", "", "also measure this S3 bucket (s3://…?endpoint=…, as remote_url); its chunks are written there")
	fl.BoolVar(&o.Peer, "peer", false, "also measure loads from a peer daemon (started in this process on loopback TCP, its disk under --dir) holding the prefix on its disk and in its RAM")
	chunkShapeFlags(cmd, &o.Layers, &o.KVHeads, &o.HeadDim, &o.ChunkTokens)
	fl.IntVar(&o.Chunks, "chunks", o.Chunks, "chunks in the prefix")
	fl.IntVar(&o.Rounds, "rounds", o.Rounds, "rounds per figure (the median is reported)")
	fl.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
