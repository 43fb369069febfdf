package main

import (
	"fmt"
	"os"
	"regexp"
	"time"

	"github.com/spf13/cobra"

	"kvtier/chaos"
)

// chaosCmd runs the fault suite against this binary's own `serve` and
// `controller` (docs/reliability.md).
func chaosCmd() *cobra.Command {
	var (
		duration time.Duration
		only     string
	)
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "run the fault suite: kill, damage and starve real daemons, and count what comes back",
		Long: "chaos starts kvtier daemons, a controller, redis-server and versitygw on loopback,\n" +
			"breaks them one fault at a time, and prints per fault the chunks stored, made\n" +
			"durable and verified, wrong bytes, durable chunks lost and the recovery time.\n" +
			"It exits non-zero if any fault read a wrong byte or lost a durable chunk.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// A client process the lease fault started (this binary run
			// again as `kvtier chaos`) does its part and exits here.
			chaos.ChildArgs = []string{"chaos"}
			chaos.Child()
			var re *regexp.Regexp
			if only != "" {
				var err error
				if re, err = regexp.Compile(only); err != nil {
					return fmt.Errorf("--only: %w", err)
				}
			}
			bin, err := os.Executable()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			reports := chaos.Run(chaos.Options{Duration: duration}, bin, re, out)
			fmt.Fprint(out, "\n"+chaos.Header)
			failed := 0
			for _, r := range reports {
				fmt.Fprint(out, r.Row())
				if !r.OK() {
					failed++
				}
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d faults failed", failed, len(reports))
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&duration, "duration", time.Second, "how long each fault keeps its load running; longer runs repeat kills (one round per 5s)")
	cmd.Flags().StringVar(&only, "only", "", "run only the faults whose names match this regular expression")
	return cmd
}
