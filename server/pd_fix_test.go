package server_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"kvtier/client"
	"kvtier/netallow"
	"kvtier/server"
	"kvtier/wire"
)

// Regression tests of the prefill/decode transfer's review findings.

// acceptOnce counts the connections ln accepts, closing each; it returns
// a function that stops it and reports the count.
func acceptOnce(ln net.Listener) func() int {
	n := make(chan int, 1)
	go func() {
		count := 0
		for {
			c, err := ln.Accept()
			if err != nil {
				n <- count
				return
			}
			count++
			c.Close()
		}
	}()
	return func() int { ln.Close(); return <-n }
}

// TestPushRefusesDestinationsNotAllowed: a client can no longer make the
// producer dial (and present the fleet's tcp_token to) an address its
// configuration does not allow; the refused PUSH leaves no transfer behind.
func TestPushRefusesDestinationsNotAllowed(t *testing.T) {
	cons := startService(t, 64<<20, server.ServiceOptions{})
	allow, err := netallow.Parse([]string{cons.tcp})
	if err != nil {
		t.Fatal(err)
	}
	prod := startService(t, 64<<20, server.ServiceOptions{PDPushAllow: allow})
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := acceptOnce(other)
	keys := pdKeys(2, 92)
	storeRaw(t, prod.remote(t), keys, 93, pChunkBytes)
	pc, ctx := prod.local(t), context.Background()
	_, err = pc.Push(ctx, 7, other.Addr().String(), client.Raw(keys), 2000, true)
	if !client.IsStatus(err, wire.StatusBadRequest) || !strings.Contains(err.Error(), "pd_push_allow") {
		t.Fatalf("push to a destination not allowed: %v", err)
	}
	if _, err := pc.PushStatus(ctx, 7); !client.IsStatus(err, wire.StatusNotFound) {
		t.Fatalf("a refused push left a transfer: %v", err)
	}
	// The allowed consumer still gets its chunks.
	if _, err := pc.Push(ctx, 8, cons.tcp, client.Raw(keys), 5000, true); err != nil {
		t.Fatal(err)
	}
	if st := waitPushed(t, pc, 8); st.State != wire.TransferDone {
		t.Fatalf("status %+v", st)
	}
	checkRaw(t, cons.remote(t), keys, 93, pChunkBytes)
	if n := accepted(); n != 0 {
		t.Fatalf("the producer connected %d times to an address not allowed", n)
	}
}

// TestPushDefaultAllowsLoopbackOnly: with no pd_push_allow, a PUSH to a
// non-loopback address is refused, and so is a name.
func TestPushDefaultAllowsLoopbackOnly(t *testing.T) {
	prod := startService(t, 64<<20, server.ServiceOptions{})
	keys := pdKeys(1, 94)
	storeRaw(t, prod.remote(t), keys, 95, pChunkBytes)
	pc := prod.local(t)
	for i, dest := range []string{"203.0.113.7:7482", "localhost:7482", "no-port"} {
		_, err := pc.Push(context.Background(), uint64(20+i), dest, client.Raw(keys), 2000, true)
		if !client.IsStatus(err, wire.StatusBadRequest) {
			t.Errorf("push to %s: %v, want BAD_REQUEST", dest, err)
		}
	}
	_ = time.Second
}
