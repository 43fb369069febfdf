package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"kvtier/replay"
)

// nodesFlags are `kvtier replay --nodes` options; the tiers' sizes and
// policy come from --ram, --disk and --policy, the load model from the
// --router service-time flags.
type nodesFlags struct {
	nodes  int
	remote float64
	scorer string
}

type nodesReport struct {
	Trace        string `json:"trace"`
	Requests     int    `json:"requests"`
	Nodes        int    `json:"nodes"`
	Policy       string `json:"policy"`
	Scorer       string `json:"scorer"`
	RAMBlocks    int    `json:"ram_blocks_per_node"`
	DiskBlocks   int    `json:"disk_blocks_per_node"`
	RemoteBlocks int    `json:"remote_blocks"`
	BlockTokens  int    `json:"block_tokens"`
	// Sources names the columns of each result's tokens_by_source and
	// fractions.
	Sources []string `json:"sources"`
	// Results holds, for each routing, the run without P2P, then with.
	Results []replay.NodesResult `json:"results"`
}

// runNodesReplay simulates the trace over a cluster of kvtier nodes under
// each routing, once without P2P and once with it.
func runNodesReplay(ctx context.Context, f replayFlags, out, progress io.Writer) error {
	if f.ramFrac <= 0 || f.diskFrac < 0 || f.nodes.remote < 0 {
		return fmt.Errorf("--ram must be positive, --disk and --remote not negative")
	}
	reqs, err := loadTrace(&f)
	if err != nil {
		return err
	}
	if f.requests > 0 && f.requests < len(reqs) {
		reqs = reqs[:f.requests]
	}
	distinct := float64(replay.Summarize(reqs).DistinctBlocks)
	cfg := replay.NodesConfig{Nodes: f.nodes.nodes, RAMBlocks: max(1, int(f.ramFrac*distinct)),
		DiskBlocks: int(f.diskFrac * distinct), RemoteBlocks: int(f.nodes.remote * distinct),
		Policy: strings.ToUpper(f.policy), Scorer: f.nodes.scorer,
		PrefillRate: f.router.prefillRate, DecodeRate: f.router.decodeRate, LoadWeight: f.router.loadWeight}
	r := nodesReport{Trace: f.trace, Requests: len(reqs), Nodes: cfg.Nodes, Policy: cfg.Policy, Scorer: cfg.Scorer,
		RAMBlocks: cfg.RAMBlocks, DiskBlocks: cfg.DiskBlocks, RemoteBlocks: cfg.RemoteBlocks,
		BlockTokens: replay.BlockSize, Sources: replay.SourceNames[:]}
	for _, routing := range replay.NodesRoutings {
		for _, p2p := range []bool{false, true} {
			cfg.Routing, cfg.P2P = routing, p2p
			fmt.Fprintf(progress, "%d nodes, routing %s, P2P %v\n", cfg.Nodes, routing, p2p)
			bar := newProgressBar(progress, !f.noProgress)
			res, err := replay.SimulateNodes(ctx, reqs, cfg, bar.update)
			bar.done()
			if err != nil {
				return err
			}
			r.Results = append(r.Results, res)
		}
	}
	if f.json {
		return printJSON(out, r)
	}
	printNodes(out, &r)
	return nil
}

func printNodes(w io.Writer, r *nodesReport) {
	fmt.Fprintf(w, "%d requests over %d nodes (%s policy, routed by %s): RAM %d blocks, disk %d blocks per node; remote %d blocks shared (blocks of %d tokens)\n\n",
		r.Requests, r.Nodes, r.Policy, r.Scorer, r.RAMBlocks, r.DiskBlocks, r.RemoteBlocks, r.BlockTokens)
	fmt.Fprintf(w, "%-12s %-4s", "routing", "P2P")
	for _, s := range r.Sources {
		fmt.Fprintf(w, " %11s", s)
	}
	fmt.Fprintf(w, " %11s\n", "hit rate")
	for _, x := range r.Results {
		fmt.Fprintf(w, "%-12s %-4s", x.Routing, map[bool]string{false: "off", true: "on"}[x.P2P])
		for _, v := range x.Fractions {
			fmt.Fprintf(w, " %10.2f%%", 100*v)
		}
		fmt.Fprintf(w, " %10.2f%%\n", 100*x.HitRate())
	}
	fmt.Fprintln(w, "\nshares of prompt tokens by where the chosen node found them: its own RAM or disk, a peer's RAM or disk\n"+
		"(P2P), the shared remote store, or nowhere (miss: recomputed, with everything after it in the prompt).\n"+
		"routing: kvtier sends each request to the node the controller's scorer rates best over the nodes' RAM and\n"+
		"disk holdings (ties in turn); kvtier+load subtracts --load-weight per request in flight from that score's\n"+
		"share of the prompt; round-robin ignores the cache.")
}
