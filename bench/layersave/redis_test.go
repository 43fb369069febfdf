package layersave

import (
	"bytes"
	"context"
	"io"
	"os/exec"
	"strings"
	"testing"

	"kvtier/internal/citest"
)

// TestRunSmallRedis runs both modes into a Redis tier at a small size:
// every round's chunks reach Redis both ways (save waits for them there),
// the per-layer rounds by ranges, and the report has the server's CPU
// column. Timings are not checked.
func TestRunSmallRedis(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		citest.Missing(t, "redis-server not installed: %v", err)
	}
	o := Options{Dir: t.TempDir(), Layers: 4, KVHeads: 2, HeadDim: 64, ChunkTokens: 16, Chunks: 3, Rounds: 2, Redis: true}
	r, err := Run(context.Background(), o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// A warm-up save per mode, then Rounds of each mode per case.
	if want := uint64((1 + 2*o.Rounds) * o.Chunks); r.Target != "redis" || len(r.Cases) != 2 || r.RangeSaved != want {
		t.Fatalf("result: %+v", r)
	}
	var out bytes.Buffer
	r.Print(&out)
	if !strings.Contains(out.String(), "Redis CPU") || !strings.Contains(out.String(), "into redis") {
		t.Fatalf("report:\n%s", out.String())
	}
}
