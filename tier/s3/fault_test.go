package s3

import (
	"context"
	"net/url"
	"syscall"
	"testing"
	"time"

	"kvtier/internal/faulttest"
	"kvtier/internal/procstop"
	"kvtier/tier/remote"
)

// The fault drills run the S3 tier under a RAM tier, with the default
// deadlines, against a real S3 server (versitygw) that is then hung or
// killed (see package faulttest).

// drillTier opens bucket on s with the default deadlines, as the daemon
// does.
func drillTier(t *testing.T, s *server, bucket string) *faulttest.Drill {
	t.Helper()
	u, err := url.Parse(s.url(bucket, "drill/"))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := Open(context.Background(), u, remote.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return faulttest.New(t, tr)
}

func TestFaultHung(t *testing.T) {
	s := startServer(t)
	d := drillTier(t, s, "fault-hung")
	proc := s.cmd.Process
	if err := procstop.Stop(proc.Pid, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			proc.Signal(syscall.SIGCONT)
		}
	})
	d.Sick(t)
	if err := proc.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed = true
	d.Healed(t, time.Now())
	d.Served(t, 0)
}

func TestFaultKilled(t *testing.T) {
	s := startServer(t)
	d := drillTier(t, s, "fault-killed")
	s.kill() // SIGKILL: connections reset, new ones refused
	d.Sick(t)
	if err := s.start(); err != nil { // the same port and directory
		t.Fatal(err)
	}
	d.Healed(t, time.Now())
	d.Served(t, 0)
}
