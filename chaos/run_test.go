package chaos

import (
	"bytes"
	"strings"
	"testing"
)

// TestRunnerStopsLikeTesting checks the testing.TB that runs faults
// outside go test: Fatal and Skip end the fault there, cleanups run last
// first, and the outcome is recorded.
func TestRunnerStopsLikeTesting(t *testing.T) {
	var out bytes.Buffer
	var order []string
	for _, c := range []struct {
		name            string
		f               func(tb testing.TB)
		failed, skipped bool
	}{
		{"fatal", func(tb testing.TB) { tb.Fatalf("broke %d", 1) }, true, false},
		{"skip", func(tb testing.TB) { tb.Skip("no tmpfs") }, false, true},
		{"error", func(tb testing.TB) { tb.Errorf("wrong"); tb.Log("went on") }, true, false},
		{"ok", func(tb testing.TB) {}, false, false},
	} {
		order = order[:0]
		r := newRunner(c.name, &out)
		reached := false
		r.run(func() {
			r.Cleanup(func() { order = append(order, "first") })
			r.Cleanup(func() { order = append(order, "second") })
			dir := r.TempDir()
			if dir == "" {
				t.Error("no temporary directory")
			}
			c.f(r)
			reached = true
		})
		if r.Failed() != c.failed || r.Skipped() != c.skipped {
			t.Errorf("%s: failed %v skipped %v, want %v %v", c.name, r.Failed(), r.Skipped(), c.failed, c.skipped)
		}
		if stops := c.name == "fatal" || c.name == "skip"; reached == stops {
			t.Errorf("%s: the fault went on after it: %v", c.name, reached)
		}
		if strings.Join(order, ",") != "second,first" {
			t.Errorf("%s: cleanups ran %v", c.name, order)
		}
	}
	for _, want := range []string{"broke 1", "no tmpfs", "wrong", "went on"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output lacks %q:\n%s", want, out.String())
		}
	}
}
