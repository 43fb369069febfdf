package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"kvtier/cluster"
)

// clusterFlags are the flags every `kvtier cluster` subcommand shares.
type clusterFlags struct {
	controller string
	instances  []string
	all        bool
	tier       string
	scope      string
	model      string
	keys       []string
	ttl        time.Duration
	to, toTier string
	timeout    time.Duration
	noWait     bool
	json       bool
}

// clusterCmd is `kvtier cluster`: the controller's cluster operations
// from the command line (docs/cluster.md, "Cluster operations").
func clusterCmd() *cobra.Command {
	f := &clusterFlags{}
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "operate on the daemons of a cluster through its controller",
		Long: `Operate on the daemons registered with a kvtier controller. Each
operation runs on every daemon it names, and the command prints one
result per daemon; it exits non-zero unless every daemon succeeded.
Chunk keys are "scope/hash" in hex, as GET /api/v1/keys on a daemon lists
them; give them as arguments or with --key.`,
	}
	cmd.PersistentFlags().StringVar(&f.controller, "controller", "http://127.0.0.1:7481", "the controller's base URL")
	cmd.PersistentFlags().BoolVar(&f.json, "json", false, "print the controller's JSON instead of a table")
	ops := []*cobra.Command{
		opCmd(f, cluster.OpClear, "clear chunks of a tier and scope (or model) on daemons", "clear (--instance NAME... | --all) [--tier mem|disk] [--scope HEX | --model NAME]"),
		opCmd(f, cluster.OpPin, "pin chunks against eviction for --ttl", "pin (--instance NAME... | --all) --ttl DURATION KEY..."),
		opCmd(f, cluster.OpUnpin, "end pins in RAM (pins on disk end after their TTL)", "unpin (--instance NAME... | --all) KEY..."),
		opCmd(f, cluster.OpCopy, "copy chunks to another daemon (--to) or tier (--to-tier)", "copy --instance SRC (--to DST [--to-tier T] | --to-tier T) KEY..."),
		opCmd(f, cluster.OpMove, "move chunks to another daemon (--to) or tier (--to-tier)", "move --instance SRC (--to DST [--to-tier T] | --to-tier T) KEY..."),
	}
	cmd.AddCommand(ops...)
	cmd.AddCommand(opsStatusCmd(f), instancesCmd(f))
	return cmd
}

func opCmd(f *clusterFlags, kind, short, use string) *cobra.Command {
	c := &cobra.Command{
		Use:   use,
		Short: short,
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := f.request(kind, args)
			if err != nil {
				return err
			}
			return f.runOp(cmd.Context(), cmd.OutOrStdout(), req)
		},
	}
	fl := c.Flags()
	fl.StringArrayVar(&f.instances, "instance", nil, "a daemon to run on (repeat for more)")
	fl.BoolVar(&f.all, "all", false, "run on every registered daemon")
	fl.DurationVar(&f.timeout, "timeout", 0, "the operation's deadline (default 30s, at most 10m)")
	fl.BoolVar(&f.noWait, "no-wait", false, "print the operation's id and return without waiting")
	switch kind {
	case cluster.OpClear:
		fl.StringVar(&f.tier, "tier", "", "the tier to clear (mem or disk; default every tier that can list its chunks)")
		fl.StringVar(&f.scope, "scope", "", "the scope id to clear, in hex (default every scope)")
		fl.StringVar(&f.model, "model", "", "clear every scope of this model")
	case cluster.OpPin:
		fl.DurationVar(&f.ttl, "ttl", 0, "how long the pin lasts (the daemon caps it at its maximum lease)")
	case cluster.OpCopy, cluster.OpMove:
		fl.StringVar(&f.to, "to", "", "the destination daemon")
		fl.StringVar(&f.toTier, "to-tier", "", "the destination tier (mem or disk)")
	}
	if kind != cluster.OpClear {
		fl.StringArrayVar(&f.keys, "key", nil, "a chunk key scope/hash (repeat for more; arguments are keys too)")
	} else {
		c.Args = cobra.NoArgs
	}
	return c
}

// request builds the operation the flags and args describe.
func (f *clusterFlags) request(kind string, args []string) (cluster.OpRequest, error) {
	r := cluster.OpRequest{Kind: kind, Instances: f.instances, All: f.all, Tier: f.tier, Model: f.model,
		TTLMS: f.ttl.Milliseconds(), To: f.to, ToTier: f.toTier, TimeoutMS: f.timeout.Milliseconds()}
	if f.scope != "" {
		if err := r.Scope.UnmarshalJSON([]byte(`"` + strings.TrimPrefix(f.scope, "0x") + `"`)); err != nil {
			return r, fmt.Errorf("--scope: %w", err)
		}
	}
	for _, s := range append(append([]string(nil), f.keys...), args...) {
		k, err := cluster.ParseChunkKey(s)
		if err != nil {
			return r, err
		}
		r.Keys = append(r.Keys, k)
	}
	return r, r.Validate()
}

// runOp starts the operation, waits for it unless --no-wait, and prints
// its per-daemon results; an operation that did not fully succeed is an
// error, so the exit status is non-zero.
func (f *clusterFlags) runOp(ctx context.Context, out io.Writer, r cluster.OpRequest) error {
	c := cluster.NewClient(f.controller, &http.Client{Timeout: 30 * time.Second})
	if ctx == nil {
		ctx = context.Background()
	}
	id, err := c.StartOp(ctx, r)
	if err != nil {
		return err
	}
	if f.noWait {
		fmt.Fprintln(out, id)
		return nil
	}
	// The controller ends the operation by its deadline; a little more
	// covers the last status request.
	wait, cancel := context.WithTimeout(ctx, r.Timeout()+10*time.Second)
	defer cancel()
	for {
		op, err := c.Op(wait, id)
		if err != nil {
			return err
		}
		if op.State != cluster.StateRunning {
			return f.printOp(out, op)
		}
		select {
		case <-wait.Done():
			return fmt.Errorf("operation %s still running: %w", id, wait.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (f *clusterFlags) printOp(out io.Writer, op cluster.Op) error {
	if f.json {
		printJSON(out, op)
	} else {
		fmt.Fprintf(out, "operation %s %s: %s\n", op.ID, op.Kind, op.State)
		for _, r := range op.Results {
			printResult(out, r)
		}
	}
	switch op.State {
	case cluster.StateOK, cluster.StateRunning:
		return nil
	}
	return fmt.Errorf("operation %s %s: %s", op.ID, op.Kind, op.State)
}

// printResult prints one daemon's line: name, role, state, counts in
// name order or the error, and how long it took.
func printResult(out io.Writer, r cluster.DaemonResult) {
	name := r.Instance
	if r.Role != "" {
		name += " (" + r.Role + ")"
	}
	detail := r.Error
	if r.State == cluster.StateOK {
		names := make([]string, 0, len(r.Counts))
		for k := range r.Counts {
			names = append(names, k)
		}
		sort.Strings(names)
		var parts []string
		for _, k := range names {
			parts = append(parts, fmt.Sprintf("%s=%d", k, r.Counts[k]))
		}
		detail = strings.Join(parts, " ")
	}
	if took := elapsed(r.Started, r.Finished); took != "" {
		detail += " (" + took + ")"
	}
	fmt.Fprintf(out, "  %-24s %-8s %s\n", name, r.State, detail)
}

func elapsed(start, end string) string {
	s, err1 := time.Parse(time.RFC3339Nano, start)
	e, err2 := time.Parse(time.RFC3339Nano, end)
	if err1 != nil || err2 != nil {
		return ""
	}
	return e.Sub(s).Round(time.Millisecond).String()
}

// opsStatusCmd is `kvtier cluster ops [ID]`: one operation's status, or
// the recent ones.
func opsStatusCmd(f *clusterFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "ops [ID]",
		Aliases: []string{"status"},
		Short:   "show an operation's per-daemon results, or list the recent operations",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c := cluster.NewClient(f.controller, nil)
			out := cmd.OutOrStdout()
			if len(args) == 1 {
				op, err := c.Op(ctx, args[0])
				if err != nil {
					return err
				}
				return f.printOp(out, op)
			}
			ops, err := c.Ops(ctx)
			if err != nil {
				return err
			}
			if f.json {
				printJSON(out, cluster.OpList{Ops: ops})
				return nil
			}
			for _, op := range ops {
				fmt.Fprintf(out, "%s  %-6s %-8s %s  %d daemons\n", op.ID, op.Kind, op.State, op.Created, len(op.Results))
			}
			return nil
		},
	}
}

// instancesCmd is `kvtier cluster instances`.
func instancesCmd(f *clusterFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "instances",
		Short: "list the daemons registered with the controller",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ins, err := cluster.NewClient(f.controller, nil).Instances(ctx)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if f.json {
				printJSON(out, map[string]any{"instances": ins})
				return nil
			}
			for _, in := range ins {
				fmt.Fprintf(out, "%-24s addr=%s admin=%s last_beat=%s stored=%d removed=%d\n",
					in.Instance, in.Addr, in.Admin, in.LastBeat, in.Chunks["stored"], in.Chunks["removed"])
			}
			return nil
		},
	}
}
