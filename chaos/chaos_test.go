package chaos

import (
	"os"
	"strings"
	"testing"
	"time"

	"kvtier/internal/servetest"
)

// The suite runs every fault with a short load by default (CI's budget);
// KVTIER_CHAOS_DURATION (a Go duration) runs each longer, with more kill
// rounds, e.g. KVTIER_CHAOS_DURATION=30s go test -run TestSuite ./chaos;
// KVTIER_CHAOS_REPORT names a file to write the table of figures to.
func TestMain(m *testing.M) {
	Child()
	code := m.Run()
	servetest.Cleanup()
	os.Exit(code)
}

func options(t *testing.T) Options {
	var o Options
	if v := os.Getenv("KVTIER_CHAOS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("KVTIER_CHAOS_DURATION=%q: %v", v, err)
		}
		o.Duration = d
	}
	return o
}

func TestSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("starts daemons, controllers and stores")
	}
	o := options(t)
	var table strings.Builder
	table.WriteString(Header)
	for _, f := range Faults() {
		r := Report{Fault: f.Name}
		t.Run(f.Name, func(t *testing.T) {
			defer func() {
				if t.Skipped() {
					r.Skipped = "see log"
				}
				r.Failed = t.Failed()
				t.Log(r.Summary())
				if !r.OK() {
					t.Errorf("wrong bytes %d, durable chunks lost %d: both must be 0", r.WrongBytes, r.Lost)
				}
			}()
			f.Run(t, o, &r)
		})
		table.WriteString(r.Row())
	}
	t.Logf("\n%s", table.String())
	if path := os.Getenv("KVTIER_CHAOS_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(table.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
}
