package server_test

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestHandshakeTimeoutProcess: a daemon with handshake_timeout: 200ms
// closes a TCP or local connection that sends no HELLO, and still serves
// one that does.
func TestHandshakeTimeoutProcess(t *testing.T) {
	p := startProc(t, t.TempDir(), "max_local_cpu_size: 0.0625\nhandshake_timeout: 200ms\n")
	for _, c := range []struct{ network, addr string }{{"tcp", p.TCP}, {"unix", p.Sock}} {
		conn, err := net.Dial(c.network, c.addr)
		if err != nil {
			t.Fatal(err)
		}
		// 25 times the configured timeout, and half the default (10 s):
		// only the configured value ends the wait before this deadline.
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = io.ReadAll(conn)
		conn.Close()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("%s: the daemon kept a silent connection open past its handshake timeout", c.network)
		}
	}
	if mustDial(t, p, false, "") == nil || mustDial(t, p, true, "") == nil {
		t.Fatal("no client")
	}
}
