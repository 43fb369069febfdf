// Package redis is kvtier's remote tier on Redis or Valkey: chunks are
// stored as plain string values, one key per chunk, so every node of a
// fleet that points at the same store shares them.
//
// # URLs
//
//	redis://[user:pass@]host[:port][/db][?params]        one server
//	rediss://...                                         the same over TLS
//	redis+cluster://[user:pass@]h1:p1,h2:p2,...[?params]  Redis Cluster, seed nodes
//	rediss+cluster://...                                 the same over TLS
//	redis+sentinel://[user:pass@]s1:p1,s2:p2/master[/db][?params]  master via Sentinel
//
// valkey, valkeys, valkey+cluster ... are accepted as synonyms. The port
// defaults to 6379 (26379 for sentinels). In a cluster URL the hosts are only
// seeds: the client learns the full slot map from them. net/url checks the
// text after the last colon as a port, so in a list the last host must carry
// its port ("h1,h2:7000" parses, "h1:7000,h2" does not), and IPv6 literals
// work in single-host URLs only. user:pass
// authenticates to the data nodes, not to the sentinels. Parameters:
//
//	prefix=kvtier/   prepended to every key (default "kvtier/")
//	pool=N           connections per server (default go-redis': 10 per CPU)
//	ttl=24h          expire objects this long after they are first stored
//	cache=N          entries of the in-process presence cache (default 65536, 0 = off)
//	layer_saves=false per-layer saves leave this tier whole chunks after the
//	                 commit instead of staged pieces (default true; stage.go)
//	ca=file.pem      TLS: trust only this CA instead of the system roots
//	cert=, key=      TLS: client certificate and key (for tls-auth-clients yes)
//
// # Keys and values
//
// A chunk.Key is stored under prefix + 16 hex digits of its scope + 32 hex
// digits of its hash, e.g. "kvtier/00000000000000070123...cdef". The value is
// the object's bytes exactly as given to Put; the codec layer above checks
// them. Put is SET NX (with PX when a ttl is set): objects are
// content-addressed, so a key that exists already holds the same bytes and
// is left alone. With a ttl, an object expires that long after it was first
// stored; storing it again does not extend it. A SET is atomic in Redis, so two writers of one key can
// never make a reader see a mix of both. Per-layer saves build an object
// in a staging key and RENAME it into place at the commit (stage.go), with
// the same bytes, NX rule and ttl as Put. Get reads the reply straight from
// the socket into the caller's buffer (go-redis GetToBuffer): the value is
// never copied through an intermediate allocation.
//
// # Presence
//
// PrefixContains sends one STRLEN per key in a single pipeline (in a cluster
// go-redis splits it by node and sends the parts concurrently) and takes the
// leading run of non-zero lengths. STRLEN rather than EXISTS because it also
// gives the size, which the manager asks for next: found keys and their sizes
// go into a small bounded cache that answers Size without a round trip. A cached key that Redis has since expired or evicted turns
// into ErrNotFound on Get, which the manager counts as a miss.
package redis

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"kvtier/chunk"
	"kvtier/codec"
	"kvtier/tier"
	"kvtier/tier/remote"
)

// Tier is a tier.Tier on one Redis deployment; it also implements
// tier.PrefixContainer, tier.Remover, tier.StatsReporter and io.Closer, and
// remote.Pinger and remote.PresenceReporter for the circuit breaker. It
// does not pin: Redis evicts on its own terms. It is safe for concurrent
// use.
type Tier struct {
	client    goredis.UniversalClient
	topology  Topology
	prefix    string
	ttl       time.Duration
	timeout   time.Duration // bound on calls that take no context
	bandwidth int64         // with timeout, bounds transfers (remote.CallDeadline)
	known     *presence
	noStage   bool         // layer_saves=false, or no staging key can share a slot
	stage     *stageSwitch // off while Redis refuses staging commands (stageoff.go)
	log       *slog.Logger
	closed    atomic.Bool
	stats     counters
}

// counters are the Stats fields this tier can know without asking Redis.
type counters struct {
	hits, misses, puts, removes, corrupt atomic.Uint64
	bytesRead, bytesWritten              atomic.Uint64
}

var (
	_ tier.Tier               = (*Tier)(nil)
	_ tier.PrefixContainer    = (*Tier)(nil)
	_ tier.Remover            = (*Tier)(nil)
	_ tier.StatsReporter      = (*Tier)(nil)
	_ io.Closer               = (*Tier)(nil)
	_ remote.Pinger           = (*Tier)(nil)
	_ remote.PresenceReporter = (*Tier)(nil)
)

// bufferSize is each connection's bufio size. Chunk payloads bypass these
// buffers (bufio reads and writes large slices directly), so they only
// batch headers and small replies; a pipeline of a few hundred STRLENs fits.
const bufferSize = 64 << 10

// Open connects to the deployment u names (see the package documentation)
// and checks that it answers. Its signature is remote.OpenFunc.
func Open(ctx context.Context, u *url.URL, o remote.Options) (tier.Tier, error) {
	t, err := Dial(ctx, u, o)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// Dial is Open returning the concrete type, for callers that want Ping or
// the client's figures.
func Dial(ctx context.Context, u *url.URL, o remote.Options) (*Tier, error) {
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	if o.Timeout <= 0 {
		o.Timeout = remote.DefaultTimeout
	}
	if o.Bandwidth <= 0 {
		o.Bandwidth = remote.DefaultBandwidth
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	t := &Tier{
		client:    goredis.NewUniversalClient(clientOptions(cfg, o.Timeout)),
		topology:  cfg.topology,
		prefix:    cfg.prefix,
		ttl:       cfg.ttl,
		timeout:   o.Timeout,
		bandwidth: o.Bandwidth,
		known:     newPresence(cfg.cacheSlots),
		noStage:   cfg.noStage,
		stage:     newStageSwitch(o.Logger),
		log:       o.Logger,
	}
	if _, sameSlot := stageName(cfg.prefix, 0); !sameSlot && cfg.topology == Cluster && !t.noStage {
		// The prefix has a "}" but no hash tag: no staging key could
		// share an object key's slot, so RENAME could never publish.
		t.noStage = true
		o.Logger.Info("redis tier: the prefix has a \"}\" but no hash tag: per-layer saves write whole chunks into this cluster",
			"prefix", cfg.prefix)
	}
	if err := t.Ping(ctx); err != nil {
		t.client.Close()
		return nil, fmt.Errorf("redis: %s does not answer: %w", u.Redacted(), err)
	}
	return t, nil
}

// clientOptions turns a parsed URL into go-redis options. Every call is
// bounded by timeout: the context's deadline when it has an earlier one,
// otherwise the socket deadlines go-redis sets per command.
func clientOptions(c config, timeout time.Duration) *goredis.UniversalOptions {
	return &goredis.UniversalOptions{
		Addrs:                 c.addrs,
		IsClusterMode:         c.topology == Cluster,
		MasterName:            c.master,
		DB:                    c.db,
		Username:              c.user,
		Password:              c.pass,
		TLSConfig:             c.tls,
		PoolSize:              c.pool,
		DialTimeout:           timeout,
		ReadTimeout:           timeout,
		WriteTimeout:          timeout,
		ContextTimeoutEnabled: true,
		// One retry covers a pooled connection the server closed while it
		// sat idle; more would only delay the circuit breaker above.
		MaxRetries: 1,
		// A refused dial fails at once: the circuit breaker, not a
		// sleeping caller, decides when to try the server again.
		DialerRetries:   1,
		ReadBufferSize:  bufferSize,
		WriteBufferSize: bufferSize,
		// Skip CLIENT SETINFO and the maintenance-notification handshake:
		// extra round trips on every new connection that a cache does not
		// need, and that proxies and older servers reject.
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
}

// Name returns "redis".
func (t *Tier) Name() string { return "redis" }

// keyName renders k under the tier's prefix.
func (t *Tier) keyName(k chunk.Key) string {
	var buf [64]byte
	b := append(buf[:0], t.prefix...)
	var scope [8]byte
	for i := range scope {
		scope[i] = byte(k.Scope >> (56 - 8*i))
	}
	b = hex.AppendEncode(b, scope[:])
	b = hex.AppendEncode(b, k.Hash[:])
	return string(b)
}

// Size returns the stored object's length, from the presence cache when it
// knows the key and with one STRLEN otherwise.
func (t *Tier) Size(key chunk.Key) (int, bool) {
	n, ok, _ := t.SizeErr(key)
	return n, ok
}

// SizeErr is Size with the error of a STRLEN that failed
// (remote.PresenceReporter).
func (t *Tier) SizeErr(key chunk.Key) (int, bool, error) {
	if t.closed.Load() {
		return 0, false, nil
	}
	if n, ok := t.known.size(key); ok {
		return n, true, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.timeout)
	defer cancel()
	n, err := t.client.StrLen(ctx, t.keyName(key)).Result()
	if isWrongType(err) {
		// Another program's value (a list, a hash) under the key: not
		// stored, as far as this tier goes, and no sign of Redis' health.
		t.stats.corrupt.Add(1)
		return 0, false, nil
	}
	if err != nil {
		t.logError("strlen", key, err)
		return 0, false, err
	}
	if n <= 0 {
		return 0, false, nil
	}
	t.known.add(key, int(n))
	return int(n), true, nil
}

// PrefixContains asks for all keys in one pipeline and returns how many
// leading keys are stored. A failed request counts as "not stored": a
// lookup must go on without this tier rather than fail.
func (t *Tier) PrefixContains(keys []chunk.Key) int {
	n, _ := t.PrefixContainsErr(keys)
	return n
}

// PrefixContainsErr is PrefixContains with the error of the pipeline, if
// it failed (remote.PresenceReporter).
func (t *Tier) PrefixContainsErr(keys []chunk.Key) (int, error) {
	if t.closed.Load() || len(keys) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.timeout)
	defer cancel()
	lens := make([]*goredis.IntCmd, len(keys))
	_, err := t.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i, k := range keys {
			lens[i] = p.StrLen(ctx, t.keyName(k))
		}
		return nil
	})
	if isWrongType(err) {
		// The pipeline reports its first failed command. A foreign value
		// (WRONGTYPE) is "not stored", not a failure of Redis: report only
		// a command that failed otherwise.
		err = nil
		for _, c := range lens {
			if e := c.Err(); e != nil && !isWrongType(e) && !errors.Is(e, goredis.Nil) {
				err = e
				break
			}
		}
	}
	if err != nil {
		t.logError("prefix strlen", keys[0], err)
	}
	n := 0
	for ; n < len(keys); n++ {
		size, e := lens[n].Result()
		if isWrongType(e) {
			t.stats.corrupt.Add(1)
		}
		if e != nil || size <= 0 {
			break
		}
		t.known.add(keys[n], int(size))
	}
	return n, err
}

// Get reads key's value into dst and returns its length. The value goes
// from the socket straight into dst. When dst is longer than the value, up
// to two bytes of dst past the returned length may be overwritten (go-redis
// reads the reply's trailing CRLF there to save a system call). A dst
// shorter than the value gives an error wrapping io.ErrShortBuffer.
func (t *Tier) Get(ctx context.Context, key chunk.Key, dst []byte) (int, error) {
	if t.closed.Load() {
		return 0, fmt.Errorf("redis: get %v: %w", key, tier.ErrClosed)
	}
	ctx, cancel := remote.BoundCall(ctx, t.timeout, t.bandwidth, len(dst))
	defer cancel()
	n, err := t.client.GetToBuffer(ctx, t.keyName(key), dst).Result()
	if err != nil {
		return 0, t.getError(key, len(dst), err)
	}
	t.stats.hits.Add(1)
	t.stats.bytesRead.Add(uint64(n))
	t.known.add(key, n)
	return n, nil
}

// getError names what went wrong with a GET and wraps the tier error the
// manager acts on.
func (t *Tier) getError(key chunk.Key, have int, err error) error {
	switch {
	case errors.Is(err, goredis.Nil):
		t.known.forget(key)
		t.stats.misses.Add(1)
		return fmt.Errorf("redis: get %v: %w", key, tier.ErrNotFound)
	case isShortBuffer(err):
		return fmt.Errorf("redis: get %v: buffer of %d bytes: %w (%v)", key, have, io.ErrShortBuffer, err)
	case isWrongType(err):
		// Something that is not a string sits under our key name: count it
		// as corrupt, but leave it alone, since someone else wrote it. It
		// is foreign, not damaged, so it says nothing of Redis' health
		// (the breaker does not count it as a corrupt read).
		t.known.forget(key)
		t.stats.corrupt.Add(1)
		return fmt.Errorf("redis: get %v: %w: %w: %v", key, tier.ErrCorrupt, codec.ErrForeign, err)
	}
	return fmt.Errorf("redis: get %v: %w", key, closedOr(err))
}

// Put stores data under key with SET NX, so an existing key (which holds
// the same bytes) is left as it is. data goes from the caller's slice
// straight to the socket.
func (t *Tier) Put(ctx context.Context, key chunk.Key, data []byte) error {
	if t.closed.Load() {
		return fmt.Errorf("redis: put %v: %w", key, tier.ErrClosed)
	}
	switch {
	case len(data) == 0:
		// STRLEN cannot tell an empty value from a missing key.
		return fmt.Errorf("redis: put %v: empty object", key)
	case len(data) > maxValue:
		return fmt.Errorf("redis: put %v: %d bytes above Redis' 512 MiB value limit: %w", key, len(data), tier.ErrTooLarge)
	}
	ctx, cancel := remote.BoundCall(ctx, t.timeout, t.bandwidth, len(data))
	defer cancel()
	stored, err := t.client.SetNX(ctx, t.keyName(key), data, t.ttl).Result()
	if err != nil {
		return fmt.Errorf("redis: put %v (%d bytes): %w", key, len(data), closedOr(err))
	}
	if stored {
		t.stats.puts.Add(1)
		t.stats.bytesWritten.Add(uint64(len(data)))
	}
	t.known.add(key, len(data))
	return nil
}

// Remove deletes key and reports whether it was there.
func (t *Tier) Remove(key chunk.Key) bool {
	if t.closed.Load() {
		return false
	}
	t.known.forget(key)
	ctx, cancel := context.WithTimeout(context.Background(), t.timeout)
	defer cancel()
	n, err := t.client.Del(ctx, t.keyName(key)).Result()
	if err != nil {
		t.logError("del", key, err)
		return false
	}
	if n > 0 {
		t.stats.removes.Add(1)
	}
	return n > 0
}

// Stats returns this process's counters. Capacity, Used and Objects stay
// 0: they belong to a store shared with other nodes, and asking for them
// would cost a round trip in a call that has no context.
func (t *Tier) Stats() tier.Stats {
	return tier.Stats{
		Name:         t.Name(),
		Hits:         t.stats.hits.Load(),
		Misses:       t.stats.misses.Load(),
		Puts:         t.stats.puts.Load(),
		Removes:      t.stats.removes.Load(),
		Corrupt:      t.stats.corrupt.Load(),
		BytesRead:    t.stats.bytesRead.Load(),
		BytesWritten: t.stats.bytesWritten.Load(),
	}
}

// Ping checks that the deployment answers: every master of a cluster, the
// one server otherwise. It is the circuit breaker's health probe.
func (t *Tier) Ping(ctx context.Context) error {
	if t.closed.Load() {
		return fmt.Errorf("redis: ping: %w", tier.ErrClosed)
	}
	if cc, ok := t.client.(*goredis.ClusterClient); ok {
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			if err := c.Ping(ctx).Err(); err != nil {
				return fmt.Errorf("%s: %w", c.Options().Addr, err)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("redis: ping: %w", closedOr(err))
		}
		return nil
	}
	if err := t.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: ping: %w", closedOr(err))
	}
	return nil
}

// Close releases the connections. Calls made afterwards return ErrClosed.
func (t *Tier) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	if err := t.client.Close(); err != nil {
		return fmt.Errorf("redis: close: %w", err)
	}
	return nil
}

// logError notes a failure of a call whose signature cannot return it.
func (t *Tier) logError(op string, key chunk.Key, err error) {
	if t.log.Enabled(context.Background(), slog.LevelDebug) {
		t.log.Debug("redis tier call failed", "op", op, "key", key, "err", err)
	}
}

// closedOr maps go-redis' closed-client error, which a call racing Close
// can see, to tier.ErrClosed.
func closedOr(err error) error {
	if errors.Is(err, goredis.ErrClosed) {
		return fmt.Errorf("%w (%v)", tier.ErrClosed, err)
	}
	return err
}

// isShortBuffer recognises GetToBuffer's "buffer too small" error, which
// go-redis builds with fmt.Errorf and so offers no value to match.
func isShortBuffer(err error) bool {
	var fromServer goredis.Error
	return !errors.As(err, &fromServer) && strings.Contains(err.Error(), "buffer too small")
}

func isWrongType(err error) bool {
	var re goredis.Error
	return errors.As(err, &re) && strings.HasPrefix(err.Error(), "WRONGTYPE")
}
