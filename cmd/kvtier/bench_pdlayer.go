package main

import (
	"github.com/spf13/cobra"

	"kvtier/bench/pdlayer"
)

func benchPDLayerCmd() *cobra.Command {
	var asJSON bool
	o := pdlayer.Defaults()
	cmd := &cobra.Command{
		Use:   "pdlayer",
		Short: "measure prefill/decode pushes per layer against whole-chunk pushes (docs/disaggregation.md)",
		Long: `pdlayer runs two daemons in this process: a producer saving chunks layer by layer
(PREPARE_STORE, each layer copied into the slots, a modelled compute time per layer,
COMMIT_STORE) and a consumer reading them layerwise (PREPARE_RETRIEVE_LAYERS,
LAYER_WAIT). Round by round it alternates between pushing after the commit (PUSH,
whole chunks) and pushing the store lease at the start (each layer sent with
RECEIVE_LAYERS as its STORE_LAYER notice comes), and reports, from the first layer's
copy, when layer 0 of every chunk and when every layer is readable on the consumer,
the CPU time, and the ratios per round.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := pdlayer.Run(cmd.Context(), o, cmd.ErrOrStderr())
			return printReport(cmd, r, err, asJSON)
		},
	}
	fl := cmd.Flags()
	chunkShapeFlags(cmd, &o.Layers, &o.KVHeads, &o.HeadDim, &o.ChunkTokens)
	fl.IntVar(&o.Chunks, "chunks", o.Chunks, "chunks per save")
	fl.DurationVar(&o.Compute, "compute", o.Compute, "modelled compute time per layer")
	fl.IntVar(&o.Rounds, "rounds", o.Rounds, "rounds per mode (the median is reported)")
	fl.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
