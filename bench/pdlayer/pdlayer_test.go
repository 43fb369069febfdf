package pdlayer

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// A small run of both modes: every byte read on the consumer is checked
// by the run itself; no timing is checked.
func TestRunSmall(t *testing.T) {
	o := Options{Layers: 4, KVHeads: 2, HeadDim: 16, ChunkTokens: 16, Chunks: 3, Compute: time.Millisecond, Rounds: 2}
	rep, err := Run(context.Background(), o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if rep.PerLayer.Layer0.Median <= 0 || rep.Whole.All.Median <= 0 || rep.Layer0.Median <= 0 {
		t.Fatalf("report %+v", rep)
	}
	var out bytes.Buffer
	rep.Print(&out)
	if !strings.Contains(out.String(), "per layer / whole") {
		t.Fatalf("printed %q", out.String())
	}
}
