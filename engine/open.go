package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"kvtier/arena"
	"kvtier/codec"
	"kvtier/kvformat"
	"kvtier/tier"
	_ "kvtier/tier/backends" // every remote scheme
	"kvtier/tier/disk"
	"kvtier/tier/mem"
	"kvtier/tier/p2p"
	"kvtier/tier/remote"
)

// Options describe a whole local hierarchy: the RAM tier's arena and
// policy, an optional disk tier, and the manager's queueing.
type Options struct {
	ChunkSize  int    // tokens per chunk
	SaveUnfull bool   // keep a trailing partial chunk
	Namespace  string // namespace of requests that name none

	RAMBytes  int64  // arena capacity
	Policy    string // eviction policy of the RAM tier
	HugePages bool
	Prefault  bool

	DiskDir         string // empty disables the disk tier
	DiskBytes       int64
	DiskDirectIO    disk.DirectMode
	DiskSegmentSize int64
	DiskSync        disk.SyncMode
	DiskPolicy      string // eviction policy of the disk tier; "" is LRU

	// RemoteURLs are remote tiers below the disk tier, in order (see
	// package remote for the schemes). Each is guarded by a circuit
	// breaker and stores sealed objects encoded with RemoteCodec (a
	// codec name; "" is raw). RemoteTimeout bounds each remote call's
	// round trip, and calls that move a chunk get its bytes' worth more
	// (remote.CallDeadline; default remote.DefaultTimeout). A URL's own
	// timeout and bandwidth parameters win over it.
	RemoteURLs    []string
	RemoteCodec   string
	RemoteTimeout time.Duration

	// P2PPeers are other daemons' TCP addresses (host:port): a P2P tier
	// between the local and the remote tiers reads chunks from their RAM
	// and disk (package p2p). P2PResolver, when set, finds the holders
	// instead (the controller's index) and P2PPeers is ignored.
	// P2PToken is the peers' tcp_token; P2PSelf this daemon's own TCP
	// address, never asked. The tier's calls have RemoteTimeout's deadline.
	P2PPeers    []string
	P2PResolver p2p.Resolver
	P2PToken    string
	P2PSelf     string

	// LeaseTTL is the lease a client gets when it asks for none (default
	// DefaultLeaseTTL); MaxLeaseTTL caps what it may ask (default
	// MaxLeaseTTL).
	LeaseTTL    time.Duration
	MaxLeaseTTL time.Duration

	// Quotas are owners of namespaces with byte quotas in the RAM and
	// disk tiers (quota.go).
	Quotas []QuotaOwner

	Tier   tier.Options
	Logger *slog.Logger
}

// Open builds the arena, the RAM tier, the disk tier if configured, and
// the manager, and returns an engine over them. Close releases all of it.
func Open(o Options) (*Engine, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.RAMBytes <= 0 {
		return nil, fmt.Errorf("engine: RAM capacity %d must be positive", o.RAMBytes)
	}
	a, err := arena.New(arena.Options{Capacity: o.RAMBytes, Name: "kvtier", HugePages: o.HugePages, Prefault: o.Prefault})
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	ram, err := mem.New(a, o.Policy)
	if err != nil {
		a.Close()
		return nil, err
	}
	var lower []tier.Tier
	if o.DiskDir != "" {
		d, err := disk.Open(o.DiskDir, disk.Options{Capacity: o.DiskBytes, DirectIO: o.DiskDirectIO,
			SegmentSize: o.DiskSegmentSize, Sync: o.DiskSync, Policy: o.DiskPolicy, Logger: o.Logger})
		if err != nil {
			a.Close()
			return nil, fmt.Errorf("engine: %w", err)
		}
		lower = append(lower, d)
	}
	if t := openP2P(o); t != nil {
		lower = append(lower, t)
	}
	// The remote tiers ask specs from now on: its book is the engine's.
	specs := &scopeSpecs{chunkTokens: o.ChunkSize, book: newScopeBook()}
	remotes, err := openRemotes(o, specs.get)
	if err != nil {
		closeTiers(lower)
		a.Close()
		return nil, err
	}
	lower = append(lower, remotes...)
	o.Tier.Logger = o.Logger
	mgr, err := tier.NewManager(ram, lower, o.Tier)
	if err != nil {
		closeTiers(lower)
		a.Close()
		return nil, err
	}
	e, err := New(mgr, o.ChunkSize, o.SaveUnfull, o.Logger)
	if err == nil {
		e.namespace = o.Namespace
		e.specs, e.book = specs, specs.book
		e.leases.setRule(o.LeaseTTL, o.MaxLeaseTTL)
		e.setQuotas(o.Quotas)
	}
	if err != nil {
		mgr.Close()
		a.Close()
		return nil, err
	}
	e.arena = a
	return e, nil
}

// closeAll closes the manager and, when the engine opened it, the arena.
func (e *Engine) closeAll() error {
	err := e.mgr.Close()
	if e.arena != nil {
		err = errors.Join(err, e.arena.Close())
	}
	return err
}

func closeTiers(ts []tier.Tier) {
	for _, t := range ts {
		tier.Close(t)
	}
}

// openRemotes opens each remote URL, guarded by a circuit breaker and
// sealing objects with the configured codec. Names are the URL schemes,
// numbered when a scheme repeats ("redis", "redis-2"), so metrics keep one
// series per tier.
func openRemotes(o Options, specOf remote.SpecFunc) ([]tier.Tier, error) {
	if len(o.RemoteURLs) == 0 {
		return nil, nil
	}
	c, err := codec.Lookup(cmpOr(o.RemoteCodec, "raw"))
	if err != nil {
		return nil, fmt.Errorf("engine: remote codec: %w", err)
	}
	timeout := o.RemoteTimeout
	if timeout <= 0 {
		timeout = remote.DefaultTimeout
	}
	var out []tier.Tier
	seen := map[string]int{}
	for _, raw := range o.RemoteURLs {
		ro, err := remote.OptionsOf(raw, remote.Options{Logger: o.Logger, Timeout: timeout})
		if err != nil {
			closeTiers(out)
			return nil, fmt.Errorf("engine: remote tier %s: %w", remote.Redact(raw), err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(remoteOpenTimeout, 4*ro.Timeout))
		t, err := remote.Open(ctx, raw, ro)
		cancel()
		if err != nil {
			closeTiers(out)
			return nil, fmt.Errorf("engine: remote tier %s: %w", remote.Redact(raw), err)
		}
		name := schemeOf(raw)
		if seen[name]++; seen[name] > 1 {
			name = fmt.Sprintf("%s-%d", name, seen[name])
		}
		g := remote.Guard(t, remote.GuardOptions{Timeout: ro.Timeout, Bandwidth: ro.Bandwidth, Logger: o.Logger.With("tier", name)})
		out = append(out, remote.Encode(g, name, c, specOf))
		o.Logger.Info("remote tier open", "tier", name, "url", remote.Redact(raw), "codec", c.Name(),
			"timeout", ro.Timeout, "bandwidth", ro.Bandwidth)
	}
	return out, nil
}

// openP2P returns the P2P tier, or nil when no peers are configured. It
// dials nothing: a peer that is down when the daemon starts is a peer
// whose circuit opens, not a daemon that fails to start.
func openP2P(o Options) tier.Tier {
	po := p2p.Options{Token: o.P2PToken, Self: o.P2PSelf, Timeout: o.RemoteTimeout, Logger: o.Logger}
	switch {
	case o.P2PResolver != nil:
		return p2p.New(o.P2PResolver, po)
	case len(o.P2PPeers) > 0:
		o.Logger.Info("p2p tier", "peers", o.P2PPeers)
		return p2p.NewStatic(o.P2PPeers, po)
	}
	return nil
}

// remoteOpenTimeout bounds connecting to a remote store when the daemon
// starts: unlike a call on the read path it may include DNS, TCP and TLS
// set-up, and nobody is waiting for a forward pass yet.
const remoteOpenTimeout = 10 * time.Second

func schemeOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return "remote"
	}
	scheme, _, _ := strings.Cut(strings.ToLower(u.Scheme), "+")
	return scheme
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// scopeSpecs remembers what the format tag of each scope says (scopeTag,
// or that it names no layout): the chunk format of a full tag
// (kvformat.ParseTag), for the codecs of remote tiers, and the layout, for
// layerwise geometries (scopes_tags.go). Scopes arrive with requests (a
// namespace, a cache salt), so it is bounded, like the chunker cache but
// further: it holds the scopes of the chunkers made since it was last
// cleared, at most maxSpecScopes, and when it is cleared so is the chunker
// cache (Engine.Chunker), so that every cached chunker's tag is held. A
// scope it does not hold is parsed again from the scope book, where
// connections registered it, and held again while there is room.
type scopeSpecs struct {
	chunkTokens int
	book        *scopeBook // asked on a miss; nil: nowhere to ask
	mu          sync.Mutex // serialises stores and clears
	n           int        // ids stored since the last clear
	m           sync.Map   // uint64 → specEntry
}

// specEntry is a scope's parsed tag; ok is false when the tag names no
// layout (remembered too, so that such a scope is not parsed again).
type specEntry struct {
	t  scopeTag
	ok bool
}

// maxSpecScopes bounds scopeSpecs (some 164 bytes a scope): four times
// the chunker cache, so that a scope whose chunker that cache dropped
// keeps its tag a good while longer.
const maxSpecScopes = 4 * maxCachedScopes

// store holds id's parsed tag, clearing everything first when the cap is
// reached; it reports whether it cleared (the caller then clears the
// chunker cache).
func (s *scopeSpecs) store(id uint64, t scopeTag, ok bool) (cleared bool) {
	s.mu.Lock()
	if _, held := s.m.Load(id); !held {
		if s.n >= maxSpecScopes {
			s.m.Clear()
			s.n = 0
			cleared = true
		}
		s.n++
	}
	s.m.Store(id, specEntry{t: t, ok: ok})
	s.mu.Unlock()
	return cleared
}

// remember holds id's tag, parsed again from the scope book, if there is
// room: it never clears, since the chunker cache would not be cleared with
// it.
func (s *scopeSpecs) remember(id uint64, t scopeTag, ok bool) {
	s.mu.Lock()
	if _, held := s.m.Load(id); !held && s.n < maxSpecScopes {
		s.n++
		s.m.Store(id, specEntry{t: t, ok: ok})
	}
	s.mu.Unlock()
}

// clear forgets every scope (tests).
func (s *scopeSpecs) clear() {
	s.mu.Lock()
	s.m.Clear()
	s.n = 0
	s.mu.Unlock()
}

// len returns how many scopes are held.
func (s *scopeSpecs) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func (s *scopeSpecs) get(id uint64) kvformat.Spec {
	t, _ := s.tag(id)
	return t.spec
}
