// Package kvtier is a remote tier on another kvtier daemon, reached over
// its TCP protocol (docs/protocol.md): the role LMCache's lm:// server
// plays. Chunks travel under their whole keys (raw keys), so the remote
// daemon stores them exactly as this one names them, whatever its own
// chunk size or namespace. Layerwise loads read a chunk a range at a time
// (RETRIEVE_RANGES, ranged.go), so raw chunks are stored as pieced objects,
// unless the daemon predates RETRIEVE_RANGES.
//
// URL: kvtier://[TOKEN@]host:port[?tls=true&ca=/path/ca.pem&server_name=x&conns=4]
// The token may also be given as the userinfo password (kvtier://:TOKEN@...).
package kvtier

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/tier"
	"kvtier/tier/remote"
	"kvtier/wire"
)

func init() { remote.Register("kvtier", Open) }

// Config is a parsed kvtier:// URL.
type Config struct {
	Addr    string
	Token   string
	TLS     *tls.Config
	Conns   int // connections kept open (default 4)
	Timeout time.Duration
	// Bandwidth, with Timeout, bounds a RETRIEVE or STORE that comes
	// without a deadline (remote.BoundCall).
	Bandwidth int64
}

// ParseURL reads a kvtier:// URL.
func ParseURL(u *url.URL) (Config, error) {
	c := Config{Addr: u.Host, Conns: 4}
	if u.Scheme != "kvtier" {
		return c, fmt.Errorf("kvtier tier: scheme %q, want kvtier", u.Scheme)
	}
	if u.Host == "" || u.Port() == "" {
		return c, errors.New("kvtier tier: want kvtier://host:port")
	}
	if u.Path != "" && u.Path != "/" {
		return c, fmt.Errorf("kvtier tier: unexpected path %q", u.Path)
	}
	if u.User != nil {
		if pw, ok := u.User.Password(); ok {
			c.Token = pw
		} else {
			c.Token = u.User.Username()
		}
	}
	q := u.Query()
	for k := range q {
		switch k {
		case "tls", "ca", "server_name", "conns":
		default:
			return c, fmt.Errorf("kvtier tier: unknown URL parameter %q (want tls, ca, server_name, conns)", k)
		}
	}
	if v := q.Get("conns"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 256 {
			return c, fmt.Errorf("kvtier tier: conns=%q, want 1 to 256", v)
		}
		c.Conns = n
	}
	if v := q.Get("tls"); v != "" {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return c, fmt.Errorf("kvtier tier: tls=%q, want true or false", v)
		}
		if on {
			tc, err := tlsConfig(u.Hostname(), q.Get("server_name"), q.Get("ca"))
			if err != nil {
				return c, err
			}
			c.TLS = tc
		}
	}
	return c, nil
}

func tlsConfig(host, serverName, caFile string) (*tls.Config, error) {
	tc := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	if serverName != "" {
		tc.ServerName = serverName
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("kvtier tier: ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kvtier tier: ca %s holds no PEM certificate", caFile)
		}
		tc.RootCAs = pool
	}
	return tc, nil
}

var (
	_ tier.Tier               = (*Tier)(nil)
	_ tier.PrefixContainer    = (*Tier)(nil)
	_ tier.StatsReporter      = (*Tier)(nil)
	_ io.Closer               = (*Tier)(nil)
	_ remote.Pinger           = (*Tier)(nil)
	_ remote.PresenceReporter = (*Tier)(nil)
)

// Tier is a remote tier on another daemon. Safe for concurrent use: it
// keeps a small pool of connections, each serving one call at a time.
// It is no tier.Remover: the protocol has no per-key delete, and chunks on
// the remote daemon age out under its own eviction policy. Nor does it pin.
type Tier struct {
	cfg  Config
	pool chan *client.Client
	mu   sync.Mutex
	done bool

	hits, misses, puts, bytesRead, bytesWritten atomic.Uint64
	noRanges                                    atomic.Bool // the remote daemon has no RETRIEVE_RANGES (ranged.go)
}

// Open implements remote.OpenFunc. It connects once to fail early on a
// wrong address or token.
func Open(ctx context.Context, u *url.URL, o remote.Options) (tier.Tier, error) {
	cfg, err := ParseURL(u)
	if err != nil {
		return nil, err
	}
	cfg.Timeout, cfg.Bandwidth = o.Timeout, o.Bandwidth
	if cfg.Timeout <= 0 {
		cfg.Timeout = remote.DefaultTimeout
	}
	if cfg.Bandwidth <= 0 {
		cfg.Bandwidth = remote.DefaultBandwidth
	}
	t := &Tier{cfg: cfg, pool: make(chan *client.Client, cfg.Conns)}
	c, err := t.dial(ctx)
	if err != nil {
		return nil, err
	}
	// Whether the daemon reads ranges decides how raw chunks are sealed
	// (ranged.go), so it is learned before the first Put.
	pctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	err = t.probeRanges(pctx, c)
	cancel()
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("kvtier tier %s: %w", t.cfg.Addr, err)
	}
	if t.noRanges.Load() {
		c.Close() // an older daemon may have closed it already
	} else {
		t.put(c)
	}
	return t, nil
}

func (t *Tier) dial(ctx context.Context) (*client.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	c, err := client.DialTCP(ctx, t.cfg.Addr, client.Options{Token: t.cfg.Token, TLS: t.cfg.TLS,
		Name: "kvtier-remote-tier", Timeout: t.cfg.Timeout})
	if err != nil {
		return nil, fmt.Errorf("kvtier tier %s: %w", t.cfg.Addr, err)
	}
	return c, nil
}

// get takes a pooled connection or dials a new one.
func (t *Tier) get(ctx context.Context) (*client.Client, error) {
	t.mu.Lock()
	done := t.done
	t.mu.Unlock()
	if done {
		return nil, tier.ErrClosed
	}
	select {
	case c := <-t.pool:
		return c, nil
	default:
		return t.dial(ctx)
	}
}

// put returns a healthy connection to the pool (or closes it when the pool
// is full or the tier closed).
func (t *Tier) put(c *client.Client) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		c.Close()
		return
	}
	select {
	case t.pool <- c:
	default:
		c.Close()
	}
}

// call runs fn on a pooled connection; a connection whose transport
// failed is dropped instead of returned.
func (t *Tier) call(ctx context.Context, fn func(*client.Client) error) error {
	c, err := t.get(ctx)
	if err != nil {
		return err
	}
	err = fn(c)
	// A checksum mismatch has closed the connection too.
	if errors.Is(err, client.ErrClosed) || errors.Is(err, client.ErrChecksum) {
		c.Close()
		return fmt.Errorf("kvtier tier %s: %w", t.cfg.Addr, err)
	}
	t.put(c)
	return err
}

func (t *Tier) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), t.cfg.Timeout)
}

// Name implements tier.Tier.
func (t *Tier) Name() string { return "kvtier" }

// PrefixContains implements tier.PrefixContainer with one LOOKUP.
func (t *Tier) PrefixContains(keys []chunk.Key) int {
	n, _ := t.PrefixContainsErr(keys)
	return n
}

// PrefixContainsErr is PrefixContains with the error of a LOOKUP that
// failed (remote.PresenceReporter), so that the circuit breaker learns of
// a daemon that refuses connections.
func (t *Tier) PrefixContainsErr(keys []chunk.Key) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	ctx, cancel := t.ctx()
	defer cancel()
	n := 0
	err := t.call(ctx, func(c *client.Client) error {
		hit, err := c.Lookup(ctx, client.Raw(keys), 0)
		n = int(hit.Chunks)
		return err
	})
	return n, err
}

// Size implements tier.Tier with SIZES.
func (t *Tier) Size(key chunk.Key) (int, bool) {
	size, ok, _ := t.SizeErr(key)
	return size, ok
}

// SizeErr is Size with the error of a SIZES that failed
// (remote.PresenceReporter).
func (t *Tier) SizeErr(key chunk.Key) (int, bool, error) {
	ctx, cancel := t.ctx()
	defer cancel()
	size, ok := 0, false
	err := t.call(ctx, func(c *client.Client) error {
		sizes, err := c.Sizes(ctx, client.Raw([]chunk.Key{key}))
		if err == nil && len(sizes) == 1 {
			size, ok = int(sizes[0]), true
		}
		return err
	})
	return size, ok, err
}

// Get implements tier.Tier with one RETRIEVE straight into dst. The
// manager sizes dst with Size first; should the object have changed size
// in between, the connection is dropped and the read fails.
func (t *Tier) Get(ctx context.Context, key chunk.Key, dst []byte) (int, error) {
	ctx, cancel := remote.BoundCall(ctx, t.cfg.Timeout, t.cfg.Bandwidth, len(dst))
	defer cancel()
	bufs := [1][]byte{dst}
	n := 0
	err := t.call(ctx, func(c *client.Client) error {
		var err error
		n, _, err = c.Retrieve(ctx, client.Raw([]chunk.Key{key}), bufs[:])
		return err
	})
	if err != nil {
		return 0, err
	}
	if n == 0 {
		t.misses.Add(1)
		return 0, fmt.Errorf("kvtier tier: %v: %w", key, tier.ErrNotFound)
	}
	t.hits.Add(1)
	t.bytesRead.Add(uint64(len(bufs[0])))
	return len(bufs[0]), nil
}

// Put implements tier.Tier with STORE.
func (t *Tier) Put(ctx context.Context, key chunk.Key, data []byte) error {
	if len(data) > wire.MaxChunkBody {
		return fmt.Errorf("kvtier tier: %d bytes: %w", len(data), tier.ErrTooLarge)
	}
	ctx, cancel := remote.BoundCall(ctx, t.cfg.Timeout, t.cfg.Bandwidth, len(data))
	defer cancel()
	var stored int
	err := t.call(ctx, func(c *client.Client) error {
		var err error
		stored, err = c.Store(ctx, client.Raw([]chunk.Key{key}), [][]byte{data})
		return err
	})
	if err != nil {
		return err
	}
	if stored != 1 {
		return fmt.Errorf("kvtier tier %s: the remote daemon had no room: %w", t.cfg.Addr, tier.ErrBusy)
	}
	t.puts.Add(1)
	t.bytesWritten.Add(uint64(len(data)))
	return nil
}

// Ping implements remote.Pinger for the circuit breaker's health probe.
func (t *Tier) Ping(ctx context.Context) error {
	return t.call(ctx, func(c *client.Client) error { return c.Ping(ctx) })
}

// Stats implements tier.StatsReporter: this side's counters (the remote daemon's
// capacity and usage are on its own admin API).
func (t *Tier) Stats() tier.Stats {
	return tier.Stats{Name: t.Name(), Hits: t.hits.Load(), Misses: t.misses.Load(), Puts: t.puts.Load(),
		BytesRead: t.bytesRead.Load(), BytesWritten: t.bytesWritten.Load()}
}

// Close implements io.Closer.
func (t *Tier) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return nil
	}
	t.done = true
	for {
		select {
		case c := <-t.pool:
			c.Close()
		default:
			return nil
		}
	}
}
