package layersave

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

// TestRunSmall runs both modes at a small size: every round saves its
// chunks durably both ways (save waits for them on disk) and the report
// names both modes. Timings are not checked.
func TestRunSmall(t *testing.T) {
	o := Options{Dir: t.TempDir(), Layers: 4, KVHeads: 2, HeadDim: 64, ChunkTokens: 16, Chunks: 3, Rounds: 2}
	r, err := Run(context.Background(), o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Cases) != 2 || r.ChunkBytes != 2*4*16*2*64*2 {
		t.Fatalf("result: %+v", r)
	}
	for _, c := range r.Cases {
		if c.Whole.Total.Median <= 0 || c.Layered.Total.Median <= 0 || c.Layered.AfterCommit.Median > c.Layered.Total.Median {
			t.Fatalf("case %s: %+v", c.Name, c)
		}
	}
	var out bytes.Buffer
	r.Print(&out)
	if !strings.Contains(out.String(), "per layer (STORE_LAYER)") || !strings.Contains(out.String(), "whole chunk after commit") {
		t.Fatalf("report:\n%s", out.String())
	}
}
