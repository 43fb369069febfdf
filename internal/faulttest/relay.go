package faulttest

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
)

// Relay is a TCP listener in front of a real server. It passes bytes both
// ways until silenced; while silent it accepts new connections and reads
// what they send but never answers, and drops what travels on the
// connections it already has: a store behind a load balancer that black
// holes traffic. Nothing in it pretends to be the server.
type Relay struct {
	l      net.Listener
	target string

	mu     sync.Mutex
	quiet  bool
	conns  []net.Conn
	closed bool
}

// StartRelay listens on a free loopback port and relays to target until
// the test ends.
func StartRelay(t testing.TB, target string) *Relay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{l: l, target: target}
	go r.accept()
	t.Cleanup(r.close)
	return r
}

// Addr is the relay's host:port.
func (r *Relay) Addr() string { return r.l.Addr().String() }

// Silence turns the black hole on or off.
func (r *Relay) Silence(on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.quiet = on
}

func (r *Relay) silent() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.quiet
}

// track remembers c so that close can end it; it reports false (and
// closes c) once the relay is closed.
func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		c.Close()
		return false
	}
	r.conns = append(r.conns, c)
	return true
}

func (r *Relay) accept() {
	for {
		c, err := r.l.Accept()
		if err != nil || !r.track(c) {
			return
		}
		if r.silent() {
			go io.Copy(io.Discard, c) // accepted, read, never answered
			continue
		}
		up, err := net.Dial("tcp", r.target)
		if err != nil {
			c.Close()
			continue
		}
		if !r.track(up) {
			return
		}
		go r.pipe(up, c)
		go r.pipe(c, up)
	}
}

// pipe copies src to dst until either side fails, dropping what it reads
// while the relay is silent.
func (r *Relay) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !r.silent() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				src.Close()
				return
			}
		}
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				dst.Close()
			}
			return
		}
	}
}

func (r *Relay) close() {
	r.l.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for _, c := range r.conns {
		c.Close()
	}
}
