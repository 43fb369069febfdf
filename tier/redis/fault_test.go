package redis

import (
	"context"
	"net/url"
	"syscall"
	"testing"
	"time"

	"kvtier/internal/faulttest"
	"kvtier/internal/redistest"
	"kvtier/tier/remote"
)

// The fault drills run the Redis tier under a RAM tier, with the default
// deadlines, against a real redis-server that is then hung, killed, or
// hidden behind a port that never answers (see package faulttest).

// drillTier opens the tier at addr with the default deadlines, as the
// daemon does.
func drillTier(t *testing.T, addr string) *faulttest.Drill {
	t.Helper()
	u, err := url.Parse("redis://" + addr + "/0")
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
	srv := redistest.Start(t)
	d := drillTier(t, srv.Addr)
	if err := srv.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			srv.Signal(syscall.SIGCONT)
		}
	})
	d.Sick(t)
	if err := srv.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed = true
	d.Healed(t, time.Now())
	d.Served(t, 0)
}

func TestFaultKilled(t *testing.T) {
	srv := redistest.Start(t)
	d := drillTier(t, srv.Addr)
	srv.Stop() // SIGKILL: connections reset, new ones refused
	d.Sick(t)
	redistest.StartOn(t, srv.Port())
	d.Healed(t, time.Now())
}

func TestFaultSilent(t *testing.T) {
	srv := redistest.Start(t)
	relay := faulttest.StartRelay(t, srv.Addr)
	d := drillTier(t, relay.Addr())
	relay.Silence(true)
	d.Sick(t)
	relay.Silence(false)
	d.Healed(t, time.Now())
	d.Served(t, 0)
}
