package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"kvtier/internal/servetest"
)

// TestBenchScaleQuick runs `kvtier bench scale --quick` as a process, so
// that the command, its fill child (the same binary, SIGKILLed) and every
// table keep working; the figures of the full run are in docs/scale.md.
func TestBenchScaleQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin, err := servetest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "scale", "--quick", "--dir", t.TempDir())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	for _, want := range []string{"| 2000 |", "clean stop", "| 10000 |", "eviction ns/chunk", "heap B/block"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("output lacks %q:\n%s", want, out)
		}
	}
}
