package replay

import (
	"context"
	"os"
	"testing"

	"kvtier/internal/citest"
)

// conversations builds a trace of n conversations of turns requests each,
// interleaved: turn t of every conversation extends turn t-1's prompt.
func conversations(n, turns int) []Request {
	var reqs []Request
	id := uint64(1000)
	prompts := make([][]uint64, n)
	for t := range turns {
		for c := range n {
			prompts[c] = append(prompts[c], id)
			id++
			reqs = append(reqs, Request{Timestamp: int64(len(reqs)) * 100, InputLength: len(prompts[c]) * BlockSize,
				OutputLength: 50, HashIDs: append([]uint64(nil), prompts[c]...)})
		}
		_ = t
	}
	return reqs
}

var testFleet = RouteConfig{Pods: 4, GPUBlocks: 4096, PrefillRate: 10000, DecodeRate: 50}

func TestRoutingByPrefixBeatsRoundRobin(t *testing.T) {
	reqs := conversations(7, 6) // 7: round robin must not map a conversation to one pod by chance
	ctx := context.Background()
	res := map[string]RouteResult{}
	for _, p := range RoutePolicies {
		r, err := SimulateRouting(ctx, reqs, testFleet, p, nil)
		if err != nil {
			t.Fatal(err)
		}
		res[p] = r
		for pod, st := range r.Events {
			if st.Malformed != 0 || st.Skipped != 0 || st.IndexErrors != 0 || st.Gaps != 0 {
				t.Errorf("%s: pod %s event stats %+v", p, pod, st)
			}
		}
	}
	kv, rr := res[RouteKVTier], res[RouteRoundRobin]
	// Every later turn of a conversation finds its whole previous prompt on
	// the pod the router picks: 5 of 6 turns reuse all but the new block.
	if kv.HitRate <= rr.HitRate || kv.HitRate < 0.5 {
		t.Errorf("kvtier hit rate %.3f, round robin %.3f", kv.HitRate, rr.HitRate)
	}
	// The index is fed only by events, yet predicts every pod's cache exactly.
	if kv.RouterAgreement != 1 {
		t.Errorf("router agreement %.3f, want 1", kv.RouterAgreement)
	}
	// 42 requests over 4 pods in turn: 11, 11, 10, 10.
	if want := 11.0 * 4 / 42; rr.RequestImbalance != want {
		t.Errorf("round robin over 42 requests and 4 pods: imbalance %.3f, want %.3f", rr.RequestImbalance, want)
	}
	if kv.Requests != len(reqs) || kv.Tokens != rr.Tokens {
		t.Errorf("requests/tokens: %+v vs %+v", kv, rr)
	}
}

func TestRoutingEvictionKeepsIndexExact(t *testing.T) {
	// Caches far too small for the working set: pods evict constantly, and
	// the router must still track every BlockRemoved.
	small := testFleet
	small.GPUBlocks = 200
	r, err := SimulateRouting(context.Background(), conversations(10, 8), small, RouteKVTier, nil)
	if err != nil {
		t.Fatal(err)
	}
	var removed uint64
	for _, st := range r.Events {
		removed += st.BlocksRemoved
	}
	if removed == 0 {
		t.Fatal("no evictions: the test does not exercise BlockRemoved")
	}
	if r.RouterAgreement != 1 {
		t.Errorf("router agreement %.3f with evictions, want 1", r.RouterAgreement)
	}
}

func TestRoutingRefusesBadConfig(t *testing.T) {
	for _, c := range []RouteConfig{{Pods: 0, GPUBlocks: 1, PrefillRate: 1, DecodeRate: 1}, {Pods: 1, GPUBlocks: 0, PrefillRate: 1, DecodeRate: 1}, {Pods: 1, GPUBlocks: 1}} {
		if _, err := SimulateRouting(context.Background(), nil, c, RouteKVTier, nil); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if _, err := SimulateRouting(context.Background(), nil, testFleet, "random", nil); err == nil {
		t.Error("unknown policy accepted")
	}
}

func TestRoutingOnTheSharedTrace(t *testing.T) {
	f, err := os.Open(citest.Shared(t, "traces", "conversation_trace.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	reqs, err := ReadTrace(f)
	if err != nil {
		t.Fatal(err)
	}
	reqs = reqs[:150]
	kv, err := SimulateRouting(context.Background(), reqs, testFleet, RouteKVTier, nil)
	if err != nil {
		t.Fatal(err)
	}
	rr, err := SimulateRouting(context.Background(), reqs, testFleet, RouteRoundRobin, nil)
	if err != nil {
		t.Fatal(err)
	}
	if kv.HitRate <= rr.HitRate || kv.RouterAgreement != 1 {
		t.Errorf("kvtier %.3f (agreement %.3f) vs round robin %.3f", kv.HitRate, kv.RouterAgreement, rr.HitRate)
	}
}
