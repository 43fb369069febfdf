// Package p2p is the tier that reads other daemons' RAM and disk: on a
// local miss the manager asks it, between the local tiers and the remote
// stores, and it pulls the chunk from a peer that holds it over the
// peer's TCP protocol (docs/protocol.md), as a peer client (wire.FlagPeer).
//
// Who holds what is a Resolver's answer: a static list of peers asked
// with LOOKUP (Static), or the controller's cluster index (FromLookup).
// Each peer sits behind the circuit breaker of the remote stores
// (remote.Guard): a sick peer is skipped, and one that comes back is
// probed back in.
//
// A read takes a lease on the peer (LOOKUP with a lease on the same
// connection), so the chunk stays in the peer's RAM (by reference) or on
// its disk (by the disk tier's pin) while it is read, and releases it
// after. The peer sends a checksum with each chunk and the reader checks
// it: a peer that dies mid-transfer, or bytes damaged on the way, give a
// miss, never wrong bytes.
//
// The tier never writes (tier.ReadOnly): the chunks it finds are promoted
// into this daemon's RAM by the manager like any lower-tier hit, and
// stores are never copied to peers.
package p2p

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"kvtier/chunk"
	"kvtier/tier"
	"kvtier/tier/remote"
)

// Peer is a daemon that holds a chunk.
type Peer struct {
	Instance string // the daemon's instance id, when the resolver knows it
	Addr     string // host:port of its TCP protocol
	Tier     string // the tier holding the chunk there ("mem", "disk"), when known
}

// Resolver says which peers hold which chunks.
type Resolver interface {
	// Holders returns, for each key, the peers that hold it, best first
	// (an empty list when none does). A resolver that cannot answer
	// returns an error, and the tier serves a miss.
	Holders(ctx context.Context, keys []chunk.Key) ([][]Peer, error)
}

// Options tune the tier. Zero values take the defaults noted.
type Options struct {
	// Token is the peers' tcp_token (the same shared secret as TCP).
	Token string
	TLS   *tls.Config
	// Self is this daemon's own TCP address: a resolver that lists it is
	// not asked for it.
	Self string
	// Timeout bounds a call's round trip (default remote.DefaultTimeout);
	// a read gets its bytes' worth more at Bandwidth (default
	// remote.DefaultBandwidth), as remote stores do.
	Timeout   time.Duration
	Bandwidth int64
	// Conns is how many connections to each peer are kept open (default 4).
	Conns int
	// RangedConns bounds the chunks layerwise loads read from one peer a
	// range at a time, each on a connection of its own (default 8); the
	// peer counts them against its max_connections, which its own clients
	// share. Chunks past it are read whole, Conns at a time.
	RangedConns int
	// Lease is how long a read's lease pins the chunk on the peer should
	// the release never come (default 10 s).
	Lease time.Duration
	// Threshold is the consecutive failures that open a peer's circuit
	// (default 5, remote.GuardOptions).
	Threshold int
	Logger    *slog.Logger
}

func (o *Options) setDefaults() {
	if o.Timeout <= 0 {
		o.Timeout = remote.DefaultTimeout
	}
	if o.Bandwidth <= 0 {
		o.Bandwidth = remote.DefaultBandwidth
	}
	if o.Conns <= 0 {
		o.Conns = 4
	}
	if o.RangedConns <= 0 {
		o.RangedConns = 8
	}
	if o.Lease <= 0 {
		o.Lease = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

var (
	_ tier.Tier            = (*Tier)(nil)
	_ tier.ReadOnly        = (*Tier)(nil)
	_ tier.PrefixContainer = (*Tier)(nil)
	_ tier.StatsReporter   = (*Tier)(nil)
	_ io.Closer            = (*Tier)(nil)
)

// Tier reads chunks from peers. Safe for concurrent use.
type Tier struct {
	res   Resolver
	peers *peers
	o     Options

	// found remembers, for a short while, where Size found a chunk, so
	// that the manager's Contains, Size and Get of one chunk ask the
	// resolver once. Never held across I/O.
	mu    sync.Mutex
	found map[chunk.Key]location
	// listed remembers, as briefly, the holders a PrefixContains was
	// told of, so that the Size of each chunk that follows (a LOOKUP then
	// a RETRIEVE) asks those holders without one resolver call per chunk:
	// with the controller's resolver that is an HTTP round trip each.
	listed map[chunk.Key]listing

	hits, misses, corrupt, bytesRead atomic.Uint64
}

// location is where a chunk was found and how large it is.
type location struct {
	addr string
	size int
	at   time.Time
}

// listing is the holders of a chunk as the resolver named them.
type listing struct {
	peers []Peer
	at    time.Time
}

// foundTTL is how long a location is trusted: long enough for the
// manager's Size then Get, short enough that a chunk evicted from the
// peer is soon looked up again.
const foundTTL = 2 * time.Second

// maxFound bounds the remembered locations; past it they are dropped
// wholesale, which costs a few extra lookups and nothing else.
const maxFound = 4096

// New returns a tier that finds chunks with res.
func New(res Resolver, o Options) *Tier {
	o.setDefaults()
	return newTier(res, newPeers(o), o)
}

// NewStatic returns a tier over a fixed list of peers (host:port): a
// lookup asks each with LOOKUP (Static), a read with SIZES (Size).
func NewStatic(addrs []string, o Options) *Tier {
	o.setDefaults()
	ps := newPeers(o)
	return newTier(&Static{addrs: addrs, peers: ps}, ps, o)
}

func newTier(res Resolver, ps *peers, o Options) *Tier {
	return &Tier{res: res, peers: ps, o: o, found: make(map[chunk.Key]location), listed: make(map[chunk.Key]listing)}
}

// Name implements tier.Tier.
func (t *Tier) Name() string { return "p2p" }

// ReadOnly implements tier.ReadOnly: the manager never writes here.
func (t *Tier) ReadOnly() {}

// Put implements tier.Tier. The manager never calls it (ReadOnly); a
// caller that does is told the tier takes no writes.
func (t *Tier) Put(context.Context, chunk.Key, []byte) error {
	return errReadOnly
}

var errReadOnly = errors.New("p2p tier: read-only: chunks are promoted locally, never written to peers")

// PrefixContains implements tier.PrefixContainer: how many leading keys
// some healthy peer holds.
func (t *Tier) PrefixContains(keys []chunk.Key) int {
	if len(keys) == 0 {
		return 0
	}
	holders, err := t.holders(keys)
	if err != nil {
		// A resolver that cannot answer now is not trusted for what it
		// said a moment ago either.
		t.unlist(keys)
		return 0
	}
	n := 0
	for n < len(keys) && n < len(holders) && t.usable(holders[n]) != "" {
		n++
	}
	if _, static := t.res.(*Static); !static {
		t.list(keys[:n], holders[:n])
	}
	return n
}

// Size implements tier.Tier: the size of key's chunk on the first healthy
// holder that still has it, remembered for the Get that follows. Static
// peers are asked with SIZES straight away: it answers presence and size
// in one round trip, where a LOOKUP would only say where to ask.
func (t *Tier) Size(key chunk.Key) (int, bool) {
	if loc, ok := t.recall(key); ok {
		return loc.size, true
	}
	if s, ok := t.res.(*Static); ok {
		for _, addr := range s.addrs {
			if size, ok := t.sizeAt(key, addr); ok {
				return size, true
			}
		}
		return 0, false
	}
	// Holders a PrefixContains was just told of are asked first; when
	// none has the chunk any more the resolver is asked afresh.
	if ps, ok := t.recallListed(key); ok {
		if size, ok := t.sizeAtAny(key, ps); ok {
			return size, true
		}
	}
	holders, err := t.holders([]chunk.Key{key})
	if err != nil || len(holders) == 0 {
		return 0, false
	}
	return t.sizeAtAny(key, holders[0])
}

// sizeAtAny asks each of ps in turn for key's size.
func (t *Tier) sizeAtAny(key chunk.Key, ps []Peer) (int, bool) {
	for _, p := range ps {
		if size, ok := t.sizeAt(key, p.Addr); ok {
			return size, true
		}
	}
	return 0, false
}

// sizeAt asks the peer at addr for key's size, unless the peer is this
// daemon or behind an open circuit, and remembers where it found it.
func (t *Tier) sizeAt(key chunk.Key, addr string) (int, bool) {
	if addr == "" || addr == t.o.Self {
		return 0, false
	}
	g := t.peers.get(addr)
	if g.Health().State == remote.StateOpen {
		return 0, false
	}
	size, ok := g.Size(key)
	if ok {
		t.remember(key, location{addr: addr, size: size, at: time.Now()})
	}
	return size, ok
}

// Get implements tier.Tier: it reads key from the peer Size found it on
// (asking the resolver again when that is forgotten).
func (t *Tier) Get(ctx context.Context, key chunk.Key, dst []byte) (int, error) {
	loc, ok := t.recall(key)
	if !ok {
		if _, ok = t.Size(key); ok {
			loc, ok = t.recall(key)
		}
	}
	if !ok {
		t.misses.Add(1)
		return 0, fmt.Errorf("p2p tier: %v: %w", key, tier.ErrNotFound)
	}
	t.forget(key) // read once: a later read looks again
	n, err := t.peers.get(loc.addr).Get(ctx, key, dst)
	if err != nil {
		t.misses.Add(1)
		if errors.Is(err, tier.ErrCorrupt) {
			t.corrupt.Add(1)
		}
		return 0, err
	}
	t.hits.Add(1)
	t.bytesRead.Add(uint64(n))
	return n, nil
}

// holders asks the resolver, bounded by the round-trip deadline.
func (t *Tier) holders(keys []chunk.Key) ([][]Peer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*t.o.Timeout)
	defer cancel()
	holders, err := t.res.Holders(ctx, keys)
	if err != nil {
		t.o.Logger.Debug("p2p tier: finding holders failed: served as a miss", "chunks", len(keys), "err", err)
	}
	return holders, err
}

// usable returns the address of the first holder in ps worth asking: not
// this daemon and not behind an open circuit; "" when there is none.
func (t *Tier) usable(ps []Peer) string {
	for _, p := range ps {
		if p.Addr != "" && p.Addr != t.o.Self && t.peers.get(p.Addr).Health().State != remote.StateOpen {
			return p.Addr
		}
	}
	return ""
}

func (t *Tier) recall(key chunk.Key) (location, bool) {
	t.mu.Lock()
	loc, ok := t.found[key]
	t.mu.Unlock()
	if ok && time.Since(loc.at) > foundTTL {
		return location{}, false
	}
	return loc, ok
}

func (t *Tier) remember(key chunk.Key, loc location) {
	t.mu.Lock()
	if len(t.found) >= maxFound {
		clear(t.found)
	}
	t.found[key] = loc
	t.mu.Unlock()
}

// list remembers the holders of keys for the Size calls that follow.
func (t *Tier) list(keys []chunk.Key, holders [][]Peer) {
	now := time.Now()
	t.mu.Lock()
	if len(t.listed)+len(keys) > maxFound {
		clear(t.listed)
	}
	for i, k := range keys[:min(len(keys), maxFound)] {
		t.listed[k] = listing{peers: holders[i], at: now}
	}
	t.mu.Unlock()
}

// unlist forgets the holders remembered for keys.
func (t *Tier) unlist(keys []chunk.Key) {
	t.mu.Lock()
	for _, k := range keys {
		delete(t.listed, k)
	}
	t.mu.Unlock()
}

// recallListed returns the holders a recent PrefixContains was told of
// for key, once: a later Size asks the resolver afresh.
func (t *Tier) recallListed(key chunk.Key) ([]Peer, bool) {
	t.mu.Lock()
	l, ok := t.listed[key]
	delete(t.listed, key)
	t.mu.Unlock()
	if !ok || time.Since(l.at) > foundTTL {
		return nil, false
	}
	return l.peers, true
}

func (t *Tier) forget(key chunk.Key) {
	t.mu.Lock()
	delete(t.found, key)
	t.mu.Unlock()
}

// Health returns each known peer's circuit breaker, by address.
func (t *Tier) Health() map[string]remote.Health { return t.peers.health() }

// Stats implements tier.StatsReporter: this side's counters (each peer's
// capacity and usage are on its own admin API).
func (t *Tier) Stats() tier.Stats {
	return tier.Stats{Name: t.Name(), Hits: t.hits.Load(), Misses: t.misses.Load(), Corrupt: t.corrupt.Load(),
		BytesRead: t.bytesRead.Load()}
}

// Close implements io.Closer: it closes every peer's connections.
func (t *Tier) Close() error { return t.peers.close() }
