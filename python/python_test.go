// Package python holds kvtier's Python side (python/kvtier: the protocol
// client, the vLLM connector, the SGLang backend and their test harness).
// This Go file only exists so that the repository's one test command,
// go test ./..., also runs the Python test suite against a daemon built
// from this tree.
package python

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"kvtier/internal/citest"
)

const python = "/usr/bin/python3"

// TestPythonSuite builds kvtier, then runs pytest over python/tests with
// KVTIER_BIN pointing at the build. Without a Python that has torch the
// suite is skipped, except under CI, where a missing toolchain must fail
// loudly rather than pass by skipping.
func TestPythonSuite(t *testing.T) {
	if err := exec.Command(python, "-c", "import torch, numpy, pytest").Run(); err != nil {
		citest.Missing(t, "%s cannot import torch, numpy and pytest: %v", python, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), suiteTimeout(t))
	defer cancel()

	bin := filepath.Join(t.TempDir(), "kvtier")
	build := exec.CommandContext(ctx, goTool(), "build", "-o", bin, "kvtier/cmd/kvtier")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building kvtier: %v\n%s", err, out)
	}

	cmd := exec.CommandContext(ctx, python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests")
	cmd.Env = append(os.Environ(), "KVTIER_BIN="+bin, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("pytest output:\n%s", out)
	if err != nil {
		t.Fatalf("pytest failed: %v", err)
	}
}

// suiteTimeout leaves the test binary's own deadline room to report.
func suiteTimeout(t *testing.T) time.Duration {
	if d, ok := t.Deadline(); ok {
		return time.Until(d) - 10*time.Second
	}
	return 5 * time.Minute
}

// goTool finds the go command: on PATH, else next to the running toolchain.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}
