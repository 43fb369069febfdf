package server_test

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/server"
	"kvtier/wire"
)

// watchedListener hands the daemon connections that note what it does
// after a write to them failed.
type watchedListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*watchedConn
}

func (l *watchedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return c, err
	}
	w := &watchedConn{Conn: c}
	l.mu.Lock()
	l.conns = append(l.conns, w)
	l.mu.Unlock()
	return w, nil
}

func (l *watchedListener) all() []*watchedConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*watchedConn(nil), l.conns...)
}

// watchedConn counts the writes begun after one failed, and notes Close.
type watchedConn struct {
	net.Conn
	failed atomic.Bool
	after  atomic.Int32
	closed atomic.Bool
}

func (c *watchedConn) Write(b []byte) (int, error) {
	if c.failed.Load() {
		c.after.Add(1)
	}
	n, err := c.Conn.Write(b)
	if err != nil {
		c.failed.Store(true)
	}
	return n, err
}

func (c *watchedConn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

// watchedDaemon is diskOnlyDaemon on a watchedListener.
func watchedDaemon(t *testing.T, opts server.ServiceOptions) (*server.Service, string, chunk.Key, *watchedListener) {
	t.Helper()
	var wl *watchedListener
	_, svc, addr, k, _ := diskOnlyDaemonOn(t, opts, func(ln net.Listener) net.Listener {
		wl = &watchedListener{Listener: ln}
		return wl
	})
	return svc, addr, k, wl
}

// waitWriteFailure waits until a write to one of the daemon's connections
// has failed and the daemon has either closed that connection or begun
// another write to it, and returns it; the bound is only against a hang.
func waitWriteFailure(t *testing.T, wl *watchedListener) *watchedConn {
	t.Helper()
	for start := time.Now(); ; time.Sleep(5 * time.Millisecond) {
		for _, c := range wl.all() {
			if c.failed.Load() && (c.closed.Load() || c.after.Load() > 0) {
				return c
			}
		}
		if time.Since(start) > 60*time.Second {
			t.Fatal("no write to the daemon's connections failed")
		}
	}
}

// waitConnsClosed waits until the daemon has no connection open; the
// bound is only against a hang (WriteTimeout is an hour).
func waitConnsClosed(t *testing.T, svc *server.Service) {
	t.Helper()
	for start := time.Now(); svc.Connections() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > 60*time.Second {
			t.Fatalf("%d connections open, want 0", svc.Connections())
		}
	}
}

// TestRangesWriteFailureWritesNothingMore: a reader stalls in the middle
// of a reply of ranges served from scratch memory; once the reply's
// write deadline cuts it off, the daemon writes nothing more to the
// connection — no error frame in the middle of the data frame cut short,
// which would wait for the stalled reader for a fresh WriteTimeout (an
// hour here) — and closes it.
func TestRangesWriteFailureWritesNothingMore(t *testing.T) {
	svc, addr, k, wl := watchedDaemon(t, server.ServiceOptions{RangeWriteTimeout: 50 * time.Millisecond, WriteTimeout: time.Hour})
	waitConnsClosed(t, svc) // the store's client
	stall(t, addr, k)
	checkWriteFailure(t, svc, wl)
}

// TestReplyWriteFailureWritesNothingMore: the same for an ordinary reply
// (PING's, of 8 MiB, to a client that sends them and reads nothing): the
// write that times out is the last one.
func TestReplyWriteFailureWritesNothingMore(t *testing.T) {
	svc, addr, _, wl := watchedDaemon(t, server.ServiceOptions{WriteTimeout: 50 * time.Millisecond})
	waitConnsClosed(t, svc)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	conn.Write(frame(wire.OpHello, 0, 1, (&wire.Hello{Version: wire.Version, Token: testToken}).Append(nil)))
	if h, _, err := wire.NewReader(conn).Next(); err != nil || h.Status != wire.StatusOK {
		t.Fatalf("hello reply %+v, %v", h, err)
	}
	ping := frame(wire.OpPing, 0, 2, make([]byte, wire.MaxMetaBody))
	go func() {
		// More than the socket buffers hold; the writes end when the
		// daemon closes the connection (or the test does).
		for range 8 {
			if _, err := conn.Write(ping); err != nil {
				return
			}
		}
	}()
	checkWriteFailure(t, svc, wl)
}

// checkWriteFailure waits for a write to a connection of the daemon to
// fail, then checks that none followed and that the connection closed.
func checkWriteFailure(t *testing.T, svc *server.Service, wl *watchedListener) {
	t.Helper()
	c := waitWriteFailure(t, wl)
	if n := c.after.Load(); n != 0 {
		t.Fatalf("%d writes to the connection after one failed", n)
	}
	waitConnsClosed(t, svc)
	if !c.closed.Load() || c.after.Load() != 0 {
		t.Fatalf("closed %v, %d writes after the failed one", c.closed.Load(), c.after.Load())
	}
}
