package p2p

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/tier"
	"kvtier/tier/remote"
)

// peers holds one guarded connection pool per peer address, made on first
// use and kept until Close.
type peers struct {
	o  Options
	mu sync.Mutex
	m  map[string]*remote.Guarded
}

func newPeers(o Options) *peers { return &peers{o: o, m: make(map[string]*remote.Guarded)} }

// get returns addr's guarded store. It dials nothing: the first call does.
func (ps *peers) get(addr string) *remote.Guarded {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	g, ok := ps.m[addr]
	if !ok {
		s := &store{addr: addr, o: ps.o, pool: make(chan *client.Client, ps.o.Conns), whole: make(chan struct{}, ps.o.Conns)}
		g = remote.Guard(s, remote.GuardOptions{Timeout: ps.o.Timeout, Bandwidth: ps.o.Bandwidth,
			Threshold: ps.o.Threshold, ReadsVerified: true, Logger: ps.o.Logger.With("tier", "p2p", "peer", addr)})
		ps.m[addr] = g
	}
	return g
}

func (ps *peers) health() map[string]remote.Health {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	h := make(map[string]remote.Health, len(ps.m))
	for addr, g := range ps.m {
		h[addr] = g.Health()
	}
	return h
}

func (ps *peers) close() error {
	ps.mu.Lock()
	gs := ps.m
	ps.m = map[string]*remote.Guarded{}
	ps.mu.Unlock()
	var err error
	for _, g := range gs {
		err = errors.Join(err, g.Close())
	}
	return err
}

var (
	_ tier.Tier               = (*store)(nil)
	_ tier.PrefixContainer    = (*store)(nil)
	_ remote.Pinger           = (*store)(nil)
	_ remote.PresenceReporter = (*store)(nil)
)

// store is one peer seen as a tier, for the circuit breaker to guard: a
// pool of peer connections (client.Options.Peer) to its TCP protocol.
type store struct {
	addr   string
	o      Options
	pool   chan *client.Client
	done   atomic.Bool
	ranged atomic.Int32  // open ranged reads (ranged.go), at most o.RangedConns
	whole  chan struct{} // whole reads instead of ranged ones, at most o.Conns at once
}

func (s *store) Name() string { return "p2p" }

func (s *store) dial(ctx context.Context) (*client.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, s.o.Timeout)
	defer cancel()
	c, err := client.DialTCP(ctx, s.addr, client.Options{Token: s.o.Token, TLS: s.o.TLS,
		Name: "kvtier-p2p", Timeout: s.o.Timeout, Peer: true})
	if err != nil {
		return nil, fmt.Errorf("p2p peer %s: %w", s.addr, err)
	}
	return c, nil
}

// call runs fn on a pooled connection (dialling one when none is idle);
// a connection whose transport failed, or that the client closed after a
// checksum mismatch, is closed, not pooled again: the next call on it
// would fail and count against the peer.
func (s *store) call(ctx context.Context, fn func(*client.Client) error) error {
	c, err := s.take(ctx)
	if err != nil {
		return err
	}
	err = fn(c)
	s.give(c, errors.Is(err, client.ErrClosed) || errors.Is(err, client.ErrChecksum))
	return err
}

// take returns a pooled connection, or dials one when none is idle.
func (s *store) take(ctx context.Context) (*client.Client, error) {
	if s.done.Load() {
		return nil, tier.ErrClosed
	}
	select {
	case c := <-s.pool:
		return c, nil
	default:
		return s.dial(ctx)
	}
}

// give pools c again, unless it is broken, the store closed or the pool
// is full.
func (s *store) give(c *client.Client, broken bool) {
	if broken || s.done.Load() {
		c.Close()
		return
	}
	select {
	case s.pool <- c:
	default:
		c.Close()
	}
}

func (s *store) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.o.Timeout)
}

// PrefixContains implements tier.PrefixContainer with one LOOKUP.
func (s *store) PrefixContains(keys []chunk.Key) int {
	n, _ := s.PrefixContainsErr(keys)
	return n
}

// PrefixContainsErr implements remote.PresenceReporter, so that the
// breaker learns of a peer that refuses connections.
func (s *store) PrefixContainsErr(keys []chunk.Key) (int, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	n := 0
	err := s.call(ctx, func(c *client.Client) error {
		hit, err := c.Lookup(ctx, client.Raw(keys), 0)
		n = int(hit.Chunks)
		return err
	})
	return n, err
}

func (s *store) Size(key chunk.Key) (int, bool) {
	size, ok, _ := s.SizeErr(key)
	return size, ok
}

// SizeErr implements remote.PresenceReporter with SIZES.
func (s *store) SizeErr(key chunk.Key) (int, bool, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	size, ok := 0, false
	err := s.call(ctx, func(c *client.Client) error {
		sizes, err := c.Sizes(ctx, client.Raw([]chunk.Key{key}))
		if err == nil && len(sizes) == 1 {
			size, ok = int(sizes[0]), true
		}
		return err
	})
	return size, ok, err
}

// Get reads key into dst on one connection: a LOOKUP with a lease pins
// the chunk on the peer (in RAM by reference, on disk by the tier's pin),
// RETRIEVE reads it with its checksum, RELEASE lets it go. The guard
// gives ctx its deadline.
func (s *store) Get(ctx context.Context, key chunk.Key, dst []byte) (int, error) {
	ctx, cancel := remote.BoundCall(ctx, s.o.Timeout, s.o.Bandwidth, len(dst))
	defer cancel()
	keys := client.Raw([]chunk.Key{key})
	bufs := [1][]byte{dst}
	n := 0
	err := s.call(ctx, func(c *client.Client) error {
		hit, err := c.Lookup(ctx, keys, uint32(s.o.Lease.Milliseconds()))
		if err != nil || hit.Chunks == 0 {
			return err
		}
		lease := hit.Lease
		n, _, err = c.Retrieve(ctx, keys, bufs[:])
		if err != nil {
			return err
		}
		if lease != 0 {
			// A release that fails leaves the lease to lapse on its own:
			// the bytes are already read and checked.
			if rerr := c.Release(ctx, lease); errors.Is(rerr, client.ErrClosed) {
				return rerr
			}
		}
		return nil
	})
	switch {
	case errors.Is(err, client.ErrChecksum):
		return 0, fmt.Errorf("p2p peer %s: %w: %w", s.addr, tier.ErrCorrupt, err)
	case err != nil:
		return 0, fmt.Errorf("p2p peer %s: %w", s.addr, err)
	case n == 0:
		return 0, fmt.Errorf("p2p peer %s: %v: %w", s.addr, key, tier.ErrNotFound)
	}
	return len(bufs[0]), nil
}

// Put implements tier.Tier; the P2P tier never writes to a peer.
func (s *store) Put(context.Context, chunk.Key, []byte) error { return errReadOnly }

// Ping implements remote.Pinger: the breaker's health probe.
func (s *store) Ping(ctx context.Context) error {
	return s.call(ctx, func(c *client.Client) error { return c.Ping(ctx) })
}

// Close closes the pooled connections.
func (s *store) Close() error {
	s.done.Store(true)
	for {
		select {
		case c := <-s.pool:
			c.Close()
		default:
			return nil
		}
	}
}
