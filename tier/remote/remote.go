// Package remote opens kvtier's remote tiers by URL and keeps them from
// hurting the node when their store misbehaves.
//
// Backends (redis, s3, fs, ...) register an OpenFunc under a URL scheme in an
// init function, the way database/sql drivers do; Open picks the backend from
// the scheme of a URL such as "redis://:secret@cache:6379/0". Registration is
// the only global state. Every scheme also takes two parameters, which Open
// removes before the backend sees the URL:
//
//	timeout=100ms    deadline of a call's round trip (Options.Timeout)
//	bandwidth=128MiB bytes per second a healthy store moves at least
//	                 (Options.Bandwidth): a call that moves n bytes gets
//	                 n/bandwidth more (CallDeadline)
//
// A remote store fails in ways a local tier does not: it stops answering,
// answers slowly, or refuses connections. Guard wraps any tier in a circuit
// breaker so that every call is bounded by a deadline, a store that keeps
// failing is cut off (calls fail fast with ErrUnavailable instead of piling
// up), and a background probe reconnects it once it answers again. Above
// it, the tier manager serves every failed read as a miss.
package remote

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"kvtier/config"
	"kvtier/tier"
)

// Deadlines of remote calls. An engine waits for a load before its forward
// pass, so a remote call may take only what recomputing the chunk would
// cost, not seconds: DefaultTimeout for the round trip plus the time the
// call's bytes need at DefaultBandwidth, the slowest rate a healthy store
// is expected to sustain (see CallDeadline). A 2 MiB chunk gets about
// 115 ms, a 32 MiB one 350 ms.
const (
	DefaultTimeout   = 100 * time.Millisecond
	DefaultBandwidth = 128 << 20 // bytes per second
)

// CallDeadline returns how long a call that moves n bytes may take: base
// for its round trip plus n bytes at bandwidth bytes per second.
func CallDeadline(base time.Duration, bandwidth int64, n int) time.Duration {
	if n <= 0 || bandwidth <= 0 {
		return base
	}
	return base + time.Duration(int64(n)*int64(time.Second)/bandwidth)
}

// Errors returned by Open. They are wrapped with the offending scheme or the
// redacted URL.
var (
	ErrUnknownScheme = errors.New("remote: unknown URL scheme")
	ErrBadURL        = errors.New("remote: bad URL")
)

// BoundCall gives ctx the deadline of a call that moves n bytes, unless it
// has a deadline already. Under Guard every Get and Put arrives with one,
// so on the daemon's path this allocates nothing; a backend used on its
// own still never waits without bound, nor cuts a large transfer short
// at the round-trip deadline.
func BoundCall(ctx context.Context, base time.Duration, bandwidth int64, n int) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, noCancel
	}
	return context.WithTimeout(ctx, CallDeadline(base, bandwidth, n))
}

func noCancel() {}

// Options are handed to a backend's OpenFunc. Zero values take the defaults
// noted.
type Options struct {
	Logger *slog.Logger // default slog.Default()
	// Timeout is the deadline of a call's round trip, default
	// DefaultTimeout; calls that move bytes get more (CallDeadline).
	Timeout time.Duration
	// Bandwidth is the slowest transfer rate, in bytes per second, that a
	// healthy store sustains; default DefaultBandwidth.
	Bandwidth int64
}

func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Bandwidth <= 0 {
		o.Bandwidth = DefaultBandwidth
	}
	return o
}

// Deadline returns how long a call that moves n bytes may take.
func (o Options) Deadline(n int) time.Duration { return CallDeadline(o.Timeout, o.Bandwidth, n) }

// URL query parameters that every scheme accepts. Open takes them out of
// the URL before the backend sees it.
const (
	paramTimeout   = "timeout"   // Options.Timeout, a duration ("150ms")
	paramBandwidth = "bandwidth" // Options.Bandwidth, bytes per second ("1GiB")
)

// OptionsOf returns o with its defaults and with whatever rawURL's timeout
// and bandwidth parameters set: the options Open hands the backend, which
// a caller also needs to guard the tier with matching deadlines.
func OptionsOf(rawURL string, o Options) (Options, error) {
	u, err := parseURL(rawURL)
	if err != nil {
		return o, err
	}
	o, _, err = takeParams(u, o.withDefaults())
	return o, err
}

// takeParams applies the common parameters of u to o and returns u's query
// without them.
func takeParams(u *url.URL, o Options) (Options, string, error) {
	if u.RawQuery == "" {
		return o, "", nil
	}
	var rest []string
	for _, part := range strings.Split(u.RawQuery, "&") {
		name, value, _ := strings.Cut(part, "=")
		name, err1 := url.QueryUnescape(name)
		value, err2 := url.QueryUnescape(value)
		if err := errors.Join(err1, err2); err != nil {
			return o, "", fmt.Errorf("%w %q: query: %v", ErrBadURL, u.Redacted(), err)
		}
		switch name {
		case paramTimeout:
			d, err := time.ParseDuration(value)
			if err != nil || d <= 0 {
				return o, "", fmt.Errorf("%w %q: timeout: want a positive duration such as 150ms, got %q", ErrBadURL, u.Redacted(), value)
			}
			o.Timeout = d
		case paramBandwidth:
			b, err := config.ParseSize(value)
			if err != nil || b <= 0 {
				return o, "", fmt.Errorf("%w %q: bandwidth: want bytes per second such as 1GiB, got %q", ErrBadURL, u.Redacted(), value)
			}
			o.Bandwidth = int64(b)
		default:
			rest = append(rest, part)
		}
	}
	return o, strings.Join(rest, "&"), nil
}

// OpenFunc opens one backend. u is the parsed URL including any user
// information; a backend must not put u.String() in errors or logs (use
// u.Redacted()).
type OpenFunc func(ctx context.Context, u *url.URL, o Options) (tier.Tier, error)

var registry struct {
	sync.RWMutex
	open map[string]OpenFunc
}

// Register makes a backend available under scheme. It panics if open is nil
// or the scheme is already registered, since both are programming errors
// found at start-up. Schemes are case-insensitive.
func Register(scheme string, open OpenFunc) {
	if open == nil {
		panic("remote: Register of nil OpenFunc for scheme " + scheme)
	}
	scheme = strings.ToLower(scheme)
	if scheme == "" {
		panic("remote: Register with empty scheme")
	}
	registry.Lock()
	defer registry.Unlock()
	if registry.open == nil {
		registry.open = make(map[string]OpenFunc)
	}
	if _, dup := registry.open[scheme]; dup {
		panic("remote: Register called twice for scheme " + scheme)
	}
	registry.open[scheme] = open
}

// Names returns the registered schemes, sorted: the remote tiers Open can
// build, as policy.Names and codec.Names list theirs.
func Names() []string {
	registry.RLock()
	defer registry.RUnlock()
	s := make([]string, 0, len(registry.open))
	for name := range registry.open {
		s = append(s, name)
	}
	sort.Strings(s)
	return s
}

// Open parses rawURL and opens the tier registered for its scheme. Errors
// never contain the URL's password: they show the URL redacted, and any
// occurrence of the password in a backend's error message is masked.
func Open(ctx context.Context, rawURL string, o Options) (tier.Tier, error) {
	u, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Scheme == "" {
		return nil, fmt.Errorf("%w %q: no scheme (want e.g. redis://host:6379); registered: %s",
			ErrBadURL, u.Redacted(), schemeList())
	}
	if o, u.RawQuery, err = takeParams(u, o.withDefaults()); err != nil {
		return nil, err
	}
	scheme := strings.ToLower(u.Scheme)
	registry.RLock()
	open := registry.open[scheme]
	registry.RUnlock()
	if open == nil {
		return nil, fmt.Errorf("%w %q in %q; registered: %s",
			ErrUnknownScheme, scheme, u.Redacted(), schemeList())
	}
	o.Logger.Debug("opening remote tier", "url", u.Redacted())
	t, err := open(ctx, u, o)
	if err != nil {
		return nil, fmt.Errorf("remote: open %s: %w", u.Redacted(), maskedError(err, u))
	}
	return t, nil
}

// parseURL parses rawURL with errors that never show its password.
func parseURL(rawURL string) (*url.URL, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error quotes the whole input, password included, so it is
		// not wrapped; only its reason is kept.
		var ue *url.Error
		reason := err.Error()
		if errors.As(err, &ue) {
			reason = maskSecrets(ue.Err.Error(), rawURL)
		}
		return nil, fmt.Errorf("%w %q: %s", ErrBadURL, Redact(rawURL), reason)
	}
	return u, nil
}

func schemeList() string {
	s := Names()
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// Redact returns rawURL with the password of its user information replaced
// by "xxxxx". Unlike url.URL.Redacted it works on text that does not parse,
// which is exactly when error messages need it.
func Redact(rawURL string) string {
	from, to, ok := passwordSpan(rawURL)
	if !ok {
		return rawURL
	}
	return rawURL[:from] + "xxxxx" + rawURL[to:]
}

// passwordSpan finds the password in "scheme://user:password@host/..."
// (or "//user:password@host") the way net/url splits a URL, without
// needing the rest to be valid, and reports whether there is one.
func passwordSpan(rawURL string) (from, to int, ok bool) {
	start := schemeEnd(rawURL)
	if !strings.HasPrefix(rawURL[start:], "//") {
		return 0, 0, false
	}
	start += len("//")
	end := len(rawURL)
	if i := strings.IndexAny(rawURL[start:], "/?#"); i >= 0 {
		end = start + i
	}
	at := strings.LastIndex(rawURL[start:end], "@")
	if at < 0 {
		return 0, 0, false
	}
	colon := strings.Index(rawURL[start:start+at], ":")
	if colon < 0 {
		return 0, 0, false // a user name alone is not a secret
	}
	return start + colon + 1, start + at, true
}

// schemeEnd returns the index just past "scheme:" in rawURL, or 0 when it
// does not start with a scheme (RFC 3986: a letter, then letters, digits,
// "+", "-" or ".").
func schemeEnd(rawURL string) int {
	for i := 0; i < len(rawURL); i++ {
		c := rawURL[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case ('0' <= c && c <= '9') || c == '+' || c == '-' || c == '.':
			if i == 0 {
				return 0
			}
		case c == ':' && i > 0:
			return i + 1
		default:
			return 0
		}
	}
	return 0
}

// maskSecrets replaces the password of rawURL wherever it occurs in msg.
func maskSecrets(msg, rawURL string) string {
	if from, to, ok := passwordSpan(rawURL); ok && to > from {
		msg = strings.ReplaceAll(msg, rawURL[from:to], "xxxxx")
	}
	return msg
}

// secretError masks a password in an error message while keeping the
// original error reachable for errors.Is and errors.As.
type secretError struct {
	msg string
	err error
}

func (e *secretError) Error() string { return e.msg }
func (e *secretError) Unwrap() error { return e.err }

// maskedError returns err unchanged when its message holds no secret of u,
// and a masked wrapper otherwise.
func maskedError(err error, u *url.URL) error {
	pw, ok := u.User.Password()
	if !ok || pw == "" {
		return err
	}
	msg := err.Error()
	masked := strings.ReplaceAll(msg, pw, "xxxxx")
	if escaped := url.PathEscape(pw); escaped != pw {
		masked = strings.ReplaceAll(masked, escaped, "xxxxx")
	}
	if masked == msg {
		return err
	}
	return &secretError{msg: masked, err: err}
}
