package main

import (
	"context"
	"fmt"
	"io"

	"kvtier/replay"
)

// routerFlags are `kvtier replay --router` options.
type routerFlags struct {
	enabled     bool
	pods        int
	gpuTokens   int
	prefillRate float64
	decodeRate  float64
	loadWeight  float64
}

type routerReport struct {
	Trace     string               `json:"trace"`
	Requests  int                  `json:"requests"`
	Pods      int                  `json:"pods"`
	GPUBlocks int                  `json:"gpu_blocks_per_pod"`
	Results   []replay.RouteResult `json:"results"`
}

// runRouterReplay compares routing policies over simulated vLLM pods.
func runRouterReplay(ctx context.Context, f replayFlags, out, progress io.Writer) error {
	reqs, err := loadTrace(&f)
	if err != nil {
		return err
	}
	if f.requests > 0 && f.requests < len(reqs) {
		reqs = reqs[:f.requests]
	}
	cfg := replay.RouteConfig{Pods: f.router.pods, GPUBlocks: f.router.gpuTokens / 16,
		PrefillRate: f.router.prefillRate, DecodeRate: f.router.decodeRate, LoadWeight: f.router.loadWeight}
	r := routerReport{Trace: f.trace, Requests: len(reqs), Pods: cfg.Pods, GPUBlocks: cfg.GPUBlocks}
	fmt.Fprintf(progress, "trace: %d requests over %d simulated pods of %d GPU blocks (16 tokens each)\n", len(reqs), cfg.Pods, cfg.GPUBlocks)
	for _, p := range replay.RoutePolicies {
		fmt.Fprintf(progress, "routing by %s\n", p)
		bar := newProgressBar(progress, !f.noProgress)
		res, err := replay.SimulateRouting(ctx, reqs, cfg, p, bar.update)
		bar.done()
		if err != nil {
			return err
		}
		r.Results = append(r.Results, res)
	}
	if f.json {
		return printJSON(out, r)
	}
	fmt.Fprintf(out, "%d requests, %d pods with %d GPU blocks each\n\n", r.Requests, r.Pods, r.GPUBlocks)
	fmt.Fprintf(out, "%-14s %9s %11s %11s %10s %10s\n", "policy", "hit rate", "req imbal.", "comp imbal.", "in flight", "agreement")
	for _, x := range r.Results {
		fmt.Fprintf(out, "%-14s %8.2f%% %11.2f %11.2f %10.2f %9.1f%%\n", x.Policy, 100*x.HitRate,
			x.RequestImbalance, x.ComputeImbalance, x.MeanInFlight, 100*x.RouterAgreement)
	}
	fmt.Fprintln(out, "\nhit rate: prompt tokens found in the chosen pod's GPU prefix cache; imbalance: busiest pod over the mean\n"+
		"(requests, prefill tokens computed); in flight: requests already running on the chosen pod at arrival;\n"+
		"agreement: requests where the router's index predicted the pod's hit exactly.")
	return nil
}
