package main

import (
	"github.com/spf13/cobra"

	"kvtier/bench/scale"
)

func benchScaleCmd() *cobra.Command {
	var dir, parts string
	var records []int
	var restarts int
	var quick, asJSON bool
	cmd := &cobra.Command{
		Use:   "scale",
		Short: "measure how per-item costs grow with the number of items (docs/scale.md)",
		Long: `scale measures how kvtier's costs grow with the number of items: the disk
tier's restart time per record after a SIGKILL, after a clean stop and with a
full scan, from 10k to 1M records (a child process of this binary fills the
tier and is killed), and the restarts at 1M five times over; heap metadata per chunk and prefix-lookup latency in the
RAM tier from 10k to 10M chunks; the cost of an eviction per stored chunk under
churn for every policy; and the router index's memory and score latency up to
10M blocks over 64 pods. The full run needs about 10 GiB of disk in --dir, 3 GiB
of RAM and a quarter of an hour; --quick runs a small version of each part.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o := scale.Full(dir)
			if quick {
				o = scale.Quick(dir)
			}
			if err := o.Select(parts, records, restarts); err != nil {
				return err
			}
			r, err := scale.Run(cmd.Context(), o, cmd.ErrOrStderr())
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
	fl.StringVar(&dir, "dir", ".kvtier-scale", "directory for the disk tier (a real disk; it grows to about 8 GiB and is left for reuse)")
	fl.BoolVar(&quick, "quick", false, "a small run of every part, to check the command")
	fl.BoolVar(&asJSON, "json", false, "print JSON")
	fl.StringVar(&parts, "parts", "", "measure only these parts, comma-separated: disk (restarts after filling), restarts (the repeated restarts of a directory disk filled), ram, churn, router")
	fl.IntSliceVar(&records, "records", nil, "disk record counts instead of the defaults (the last one is the repeated restarts')")
	fl.IntVar(&restarts, "restarts", 0, "times the restarts at the largest record count are repeated (0: the default)")
	return cmd
}
