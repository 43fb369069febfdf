// Package remote opens kvtier's remote tiers by URL and keeps them from
// hurting the node when their store misbehaves.
//
// Backends (redis, s3, fs, ...) register an OpenFunc under a URL scheme in an
// init function, the way database/sql drivers do; Open picks the backend from
// the scheme of a URL such as "redis://:secret@cache:6379/0". Registration is
// the only global state.
//
// A remote store fails in ways a local tier does not: it stops answering,
// answers slowly, or refuses connections. Guard wraps any tier in a circuit
// breaker so that every call is bounded by a deadline, a store that keeps
// failing is cut off (calls fail fast with ErrUnavailable instead of piling
// up), and a background probe reconnects it once it answers again.
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

	"kvtier/tier"
)

// DefaultTimeout is the per-operation deadline when Options.Timeout is zero.
const DefaultTimeout = 2 * time.Second

// Errors returned by Open. They are wrapped with the offending scheme or the
// redacted URL.
var (
	ErrUnknownScheme = errors.New("remote: unknown URL scheme")
	ErrBadURL        = errors.New("remote: bad URL")
)

// Options are handed to a backend's OpenFunc. Zero values take the defaults
// noted.
type Options struct {
	Logger  *slog.Logger  // default slog.Default()
	Timeout time.Duration // per-operation deadline, default DefaultTimeout
}

func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	return o
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

// Schemes returns the registered schemes, sorted.
func Schemes() []string {
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
	o = o.withDefaults()
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
	if u.Scheme == "" {
		return nil, fmt.Errorf("%w %q: no scheme (want e.g. redis://host:6379); registered: %s",
			ErrBadURL, u.Redacted(), schemeList())
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

func schemeList() string {
	s := Schemes()
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
