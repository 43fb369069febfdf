package server_test

import (
	"strconv"
	"testing"

	"kvtier/internal/servetest"
)

// Tests in this file's family run the real daemon, `kvtier serve`, as a
// process of its own (package servetest): what they measure (its RSS) or
// do to it (SIGKILL) must not be mixed up with the test binary.

// proc is a running `kvtier serve`.
type proc struct{ *servetest.Daemon }

// startProc runs `kvtier serve` on conf plus a private socket, ports and
// data directory in dir; it returns once the daemon is ready.
func startProc(t *testing.T, dir, conf string) *proc {
	t.Helper()
	return &proc{servetest.Start(t, dir, conf)}
}

// kill ends the daemon with SIGKILL: nothing of its shutdown runs.
func (p *proc) kill() { p.Kill() }

// rss returns the daemon's resident set size (VmRSS) in bytes.
func (p *proc) rss(t *testing.T) int64 { return p.RSS(t) }

// metric returns the value of one unlabelled metric from /metrics.
func (p *proc) metric(t *testing.T, name string) float64 {
	t.Helper()
	s := p.Metric(t, name)
	if s == "" {
		t.Fatalf("/metrics has no %s", name)
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("%s %s: %v", name, s, err)
	}
	return v
}
