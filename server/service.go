package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"kvtier/engine"
	"kvtier/internal/ratelog"
	"kvtier/kvevents/announce"
	"kvtier/netallow"
	"kvtier/tenant"
	"kvtier/wire"
)

// ServiceOptions configure the daemon's cache protocols.
type ServiceOptions struct {
	// Token is the shared secret TCP clients present in HELLO. Required
	// unless every TCP listener is on loopback. The local socket relies on
	// its file mode instead.
	Token string
	// Tenants, when set, bind tokens to namespaces (tenant.go): then every
	// connection, local ones too, presents Token or a tenant's token.
	Tenants *tenant.Set
	// MaxLeases bounds the leases one connection may hold (default 4096).
	MaxLeases int
	// MaxScopes bounds the scopes one connection may register (default 256).
	MaxScopes int
	// HandshakeTimeout bounds the wait for HELLO (default 10 s) and
	// WriteTimeout any one reply (default 60 s), so a stalled peer cannot
	// hold arena references forever.
	HandshakeTimeout time.Duration
	WriteTimeout     time.Duration
	// RangeWriteTimeout bounds a RETRIEVE_RANGES reply whose ranges sit in
	// one of the engine's few scratch buffers (read from the disk tier),
	// plus the time its bytes take at 64 MiB/s (default 1 s): a reader
	// that stops reading loses its connection then, and the buffer is
	// free for others, instead of holding it for WriteTimeout per frame.
	RangeWriteTimeout time.Duration
	// MaxConns bounds the open connections, local and TCP together
	// (default 1024); one more is answered NO_SPACE and closed.
	MaxConns int
	// FrameTimeout is how long a frame may take to arrive in full once
	// its header has (default 30 s): a peer that stalls mid-frame is cut
	// off instead of holding the daemon's memory.
	FrameTimeout time.Duration
	// BodyBudget bounds the bytes of metadata bodies larger than
	// wire.SmallBody that all connections together may buffer (default
	// 64 MiB: eight bodies of wire.MaxMetaBody may be read at once).
	BodyBudget int
	// PDReceiveBytes bounds the bytes of chunks pushed to this daemon
	// (RECEIVE) that it holds for their readers at once (default 1 GiB,
	// at most half the arena); a push over it waits.
	PDReceiveBytes int64
	// PDPushAllow lists the destinations a PUSH may name (pd_push_allow);
	// nil or empty allows loopback addresses only (docs/disaggregation.md).
	PDPushAllow *netallow.List
	// PDPushTLS, when set, makes pushes dial their destination over TLS
	// with it (tcp_tls_ca); an empty ServerName is the destination's host.
	PDPushTLS *tls.Config
	// Events, when set, is told the vLLM block hashes of chunks stored by
	// token ids, so it can announce them (see package announce).
	Events *announce.Publisher
	Logger *slog.Logger
}

func (o *ServiceOptions) setDefaults() {
	if o.MaxLeases <= 0 {
		o.MaxLeases = 4096
	}
	if o.MaxScopes <= 0 {
		o.MaxScopes = 256
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 10 * time.Second
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 60 * time.Second
	}
	if o.RangeWriteTimeout <= 0 {
		o.RangeWriteTimeout = time.Second
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 1024
	}
	if o.FrameTimeout <= 0 {
		o.FrameTimeout = 30 * time.Second
	}
	if o.BodyBudget <= 0 {
		o.BodyBudget = 64 << 20
	}
	o.BodyBudget = max(o.BodyBudget, wire.MaxMetaBody)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Service serves kvtier's cache protocol (package wire) over a local Unix
// socket, where the arena's memfd is shared with the client, and over TCP,
// where chunk bytes travel in frames. One goroutine serves each connection
// and handles its requests in order.
type Service struct {
	eng     *engine.Engine
	opts    ServiceOptions
	log     *slog.Logger
	logs    ratelog.Set // lines a hostile or failing peer could repeat per connection
	metrics *opMetrics
	pd      *pd
	tiers   int // the engine's tier count, fixed when it opened (asking allocates)

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	sessions  map[*session]struct{}
	closing   bool
	wg        sync.WaitGroup // sessions and accept loops
	// closed mirrors closing for the sessions' request loops, which check
	// it before every request: an atomic load, where taking mu would make
	// every connection's requests contend on one lock.
	closed atomic.Bool

	conns    atomic.Int64
	refused  atomic.Uint64
	refusing chan struct{} // connections being refused now
	bodies   *bodyPool
	stop     chan struct{} // stops the janitor
	swept    sync.WaitGroup
}

// NewService returns a service over eng. Call Shutdown to stop it.
func NewService(eng *engine.Engine, opts ServiceOptions) *Service {
	opts.setDefaults()
	s := &Service{
		eng:       eng,
		opts:      opts,
		log:       opts.Logger,
		metrics:   newOpMetrics(),
		listeners: make(map[net.Listener]struct{}),
		sessions:  make(map[*session]struct{}),
		stop:      make(chan struct{}),
		refusing:  make(chan struct{}, maxRefusing),
		bodies:    newBodyPool(opts.BodyBudget),
		pd:        newPD(eng, opts.PDReceiveBytes, opts.Token, opts.PDPushAllow, opts.Logger),
	}
	s.pd.tls = opts.PDPushTLS
	if eng != nil { // nil only where the service's metrics alone are wanted
		s.tiers = eng.TierCount()
	}
	s.swept.Add(1)
	go s.sweep()
	return s
}

// ListenUnix creates the local socket at path with the given mode (0600
// when zero). A stale socket file left by a dead daemon is replaced; a
// live one is an error, as is any other file at path.
func ListenUnix(path string, mode os.FileMode) (*net.UnixListener, error) {
	if mode == 0 {
		mode = 0o600
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("local socket %s: a file that is not a socket is in the way", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("local socket %s: another daemon is listening on it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("local socket %s: removing the stale socket: %w", path, err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("local socket: %w", err)
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("local socket %s: %w", path, err)
	}
	return ln, nil
}

// ListenTCP listens on addr, with TLS when tlsConf is not nil. Listening
// beyond loopback without a token is refused: the port would let anyone
// read and write the cache.
func (s *Service) ListenTCP(addr string, tlsConf *tls.Config) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp listener: %w", err)
	}
	if s.opts.Token == "" && !isLoopback(ln.Addr()) {
		ln.Close()
		return nil, fmt.Errorf("tcp listener %s: a token (tcp_token / KVTIER_TCP_TOKEN) is required to listen beyond loopback", addr)
	}
	if tlsConf != nil {
		ln = tls.NewListener(ln, tlsConf)
	}
	return ln, nil
}

func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// Serve accepts connections on ln until Shutdown; connections on a Unix
// listener get the shared arena, others exchange chunk bytes in frames.
// It returns nil after Shutdown.
func (s *Service) Serve(ln net.Listener) error {
	if !s.track(ln) {
		ln.Close()
		return nil
	}
	defer s.untrack(ln)
	_, local := ln.(*net.UnixListener)
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.isClosing() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return fmt.Errorf("accept on %s: %w", ln.Addr(), err)
		}
		sess := newSession(s, c, local)
		switch s.add(sess) {
		case added:
			go sess.serve()
		case full:
			s.refuse(c)
		case closing:
			c.Close()
			return nil
		}
	}
}

func (s *Service) track(ln net.Listener) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.listeners[ln] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *Service) untrack(ln net.Listener) {
	s.mu.Lock()
	delete(s.listeners, ln)
	s.mu.Unlock()
	s.wg.Done()
}

type addResult uint8

const (
	added   addResult = iota
	full              // MaxConns are open
	closing           // the service is shutting down
)

func (s *Service) add(sess *session) addResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return closing
	}
	if len(s.sessions) >= s.opts.MaxConns {
		return full
	}
	s.sessions[sess] = struct{}{}
	s.wg.Add(1)
	s.conns.Add(1)
	return added
}

func (s *Service) remove(sess *session) {
	s.mu.Lock()
	delete(s.sessions, sess)
	s.mu.Unlock()
	s.conns.Add(-1)
	s.wg.Done()
}

func (s *Service) isClosing() bool { return s.closed.Load() }

// Connections returns the number of open client connections.
func (s *Service) Connections() int64 { return s.conns.Load() }

// Shutdown stops accepting, lets each connection finish the request it is
// serving, then closes it; every lease a connection held is released.
// Connections still busy when ctx is done are closed mid-request (a store
// cut short is never visible).
func (s *Service) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return nil
	}
	s.closing = true
	s.closed.Store(true)
	s.pd.cancel() // wakes RECEIVEs waiting for budget and WAITs; pending pushes fail
	for ln := range s.listeners {
		ln.Close()
	}
	for sess := range s.sessions {
		sess.wakeIfIdle()
	}
	s.mu.Unlock()

	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		s.mu.Lock()
		for sess := range s.sessions {
			sess.conn.Close()
		}
		s.mu.Unlock()
		<-done
		err = ctx.Err()
	}
	close(s.stop)
	s.swept.Wait()
	s.pd.close()
	return err
}

// sweep hands the memory of idle large-body buffers back now and then.
// (Leases expire in the engine, which has the one reaper of them.)
func (s *Service) sweep() {
	defer s.swept.Done()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-tick.C:
			s.bodies.returnMemory()
			s.pd.sweep(now)
		}
	}
}
