// Command kvtier is kvtier's single binary: `serve` runs the node daemon
// (the engine behind the cache protocols and an HTTP admin API),
// `controller` runs the KV-aware router over vLLM's KV events, `cluster`
// runs operations on a controller's daemons (clear, pin, copy, move), `bench`
// measures the tiers against raw baselines in one run, `replay` drives
// a request trace through the real engine, and `chaos` runs the fault
// suite against this binary's own daemons.
//
// This package parses commands and flags and wires packages together; the
// work lives in those packages (engine and server, controller, bench,
// replay), where it can be tested without the binary.
package main

import (
	"fmt"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"

	"kvtier/bench/scale"
)

func main() {
	scale.RunChildIfAsked() // a disk-fill child of `kvtier bench scale`
	root := &cobra.Command{
		Use:           "kvtier",
		Short:         "kvtier: a tiered KV-cache layer for LLM serving",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCmd(), controllerCmd(), benchCmd(), replayCmd(), versionCmd())
	root.AddCommand(clusterCmd())
	root.AddCommand(healthcheckCmd())
	root.AddCommand(chaosCmd())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kvtier:", err)
		os.Exit(1)
	}
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			v := "(devel)"
			if bi, ok := debug.ReadBuildInfo(); ok {
				v = bi.Main.Version
				for _, s := range bi.Settings {
					if s.Key == "vcs.revision" {
						v += " " + s.Value
					}
				}
			}
			fmt.Fprintln(cmd.OutOrStdout(), "kvtier", v)
		},
	}
}
