package chaos

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"kvtier/internal/servetest"
)

// TestCommand runs `kvtier chaos` itself on the fault whose client
// processes are the binary run again as `kvtier chaos`: the command's
// wiring, its child mode and its table.
func TestCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("runs kvtier chaos")
	}
	bin, err := servetest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "chaos", "--only", "^client-lease-death$").CombinedOutput()
	if err != nil {
		t.Fatalf("kvtier chaos: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), Header) || !strings.Contains(string(out), "| client-lease-death | 4 | 4 | 4 | 0 | 0 | 0 |") {
		t.Fatalf("no table row for the fault:\n%s", out)
	}
	if strings.Contains(string(out), "sigkill-disk") {
		t.Errorf("--only ran other faults:\n%s", out)
	}
	out, err = exec.CommandContext(ctx, bin, "chaos", "--only", "[").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--only") {
		t.Errorf("a bad --only pattern: %v\n%s", err, out)
	}
}
