package layerwise

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

// TestRunSmall runs the whole measurement on small shapes: every figure
// is filled in and the first rounds' bytes were checked (Run fails on
// wrong bytes).
func TestRunSmall(t *testing.T) {
	o := Options{Dir: t.TempDir(), Layers: 4, KVHeads: 2, HeadDim: 64, ChunkTokens: 16, Chunks: 3, Rounds: 1}
	r, err := Run(context.Background(), o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Tiers) != 1 || r.Tiers[0].Layer0 <= 0 || r.Tiers[0].All < r.Tiers[0].Layer0 || len(r.TTFT) != 3 || r.RAM.Today <= 0 {
		t.Fatalf("result %+v", r)
	}
	var out bytes.Buffer
	r.Print(&out)
	if !strings.Contains(out.String(), "l0/all") || !strings.Contains(out.String(), "RAM hit") {
		t.Fatalf("printed:\n%s", out.String())
	}
}

// TestRunSmallPeer adds the P2P rows: the prefix read from a peer
// daemon's disk and from its RAM, over loopback TCP, with the first
// rounds' bytes checked.
func TestRunSmallPeer(t *testing.T) {
	o := Options{Dir: t.TempDir(), Layers: 4, KVHeads: 2, HeadDim: 64, ChunkTokens: 16, Chunks: 3, Rounds: 1, Peer: true}
	r, err := Run(context.Background(), o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Tiers) != 3 || r.Tiers[1].Tier != "peer-disk" || r.Tiers[2].Tier != "peer-ram" || len(r.TTFT) != 9 {
		t.Fatalf("result %+v", r)
	}
	for _, row := range r.Tiers {
		if row.Layer0 <= 0 || row.All < row.Layer0 || row.Whole <= 0 {
			t.Fatalf("row %+v", row)
		}
	}
	for _, row := range r.Tiers[1:] { // the peer served the loads: it counted them
		if row.WholeRequests < 3 || row.LayersRequests < 3 {
			t.Fatalf("peer row %s: %v requests whole, %v by layers", row.Tier, row.WholeRequests, row.LayersRequests)
		}
	}
}
