package kvtier_test

import (
	"context"
	"testing"
	"time"

	"kvtier/internal/faulttest"
	"kvtier/tier/remote"
)

// The fault drills run the kvtier:// tier under a RAM tier, with the
// default deadlines, against another daemon's TCP protocol that then goes
// silent behind a relay or stops (see package faulttest).

// drillTier opens the tier at addr with the default deadlines, as the
// daemon does.
func drillTier(t *testing.T, addr string) *faulttest.Drill {
	t.Helper()
	tr, err := remote.Open(context.Background(), "kvtier://"+token+"@"+addr, remote.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return faulttest.New(t, tr)
}

func TestFaultSilent(t *testing.T) {
	addr, _, _ := remoteDaemon(t, "127.0.0.1:0")
	relay := faulttest.StartRelay(t, addr)
	d := drillTier(t, relay.Addr())
	relay.Silence(true)
	d.Sick(t)
	relay.Silence(false)
	d.Healed(t, time.Now())
	d.Served(t, 0)
}

func TestFaultStopped(t *testing.T) {
	addr, _, stop := remoteDaemon(t, "127.0.0.1:0")
	d := drillTier(t, addr)
	stop() // connections closed, new ones refused
	d.Sick(t)
	remoteDaemon(t, addr) // an empty daemon on the same port
	d.Healed(t, time.Now())
}
