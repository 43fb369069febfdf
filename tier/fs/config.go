package fs

import (
	"fmt"
	"math"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"
)

// Config says where and how the tier stores objects. Zero values take the
// defaults noted.
type Config struct {
	// Root is the absolute directory shared by every node.
	Root string
	// Prefix is a relative directory under Root that namespaces this
	// cache (default "kvtier/"; "" stores under Root itself).
	Prefix string
	// Capacity bounds the bytes stored under Root/Prefix; 0 means no
	// bound. The sweeper evicts the oldest files when it is exceeded.
	Capacity int64
	// SweepInterval is how often the sweeper checks Capacity
	// (default 1m; unused without a capacity).
	SweepInterval time.Duration
	// Parallel bounds concurrent stats in PrefixContains (default 8),
	// so a prefix lookup on NFS costs about one round trip, not one per key.
	Parallel int
	// TempMaxAge is how old a temporary file must be before it is
	// considered left by a crashed writer and removed (default 1h, far
	// beyond any real write).
	TempMaxAge time.Duration
}

// DefaultPrefix namespaces the cache's files under the shared directory.
const DefaultPrefix = "kvtier/"

func (c Config) withDefaults() Config {
	if c.SweepInterval <= 0 {
		c.SweepInterval = time.Minute
	}
	if c.Parallel <= 0 {
		c.Parallel = 8
	}
	if c.TempMaxAge <= 0 {
		c.TempMaxAge = time.Hour
	}
	return c
}

// ParseURL reads a Config from "fs:///abs/path?capacity=10GiB&prefix=kv/".
// Query parameters: capacity (bytes with an optional unit B, KB, MB, GB,
// TB, KiB, MiB, GiB, TiB), prefix, sweep (a Go duration), parallel.
// Unknown parameters are errors, so a typo cannot silently drop a bound.
func ParseURL(u *url.URL) (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("fs tier: URL %q: %s", u.Redacted(), fmt.Sprintf(format, args...))
	}
	switch {
	case !strings.EqualFold(u.Scheme, "fs"):
		return bad("scheme must be fs")
	case u.Opaque != "":
		return bad("path must be absolute: write fs:///abs/path")
	case u.User != nil:
		return bad("user information is not allowed")
	case u.Host != "" && u.Host != "localhost":
		return bad("host %q is not allowed: mount the share and give its local path", u.Host)
	case u.Fragment != "":
		return bad("fragment is not allowed")
	case u.Path == "" || !path.IsAbs(u.Path):
		return bad("path must be absolute")
	}
	c := Config{Root: path.Clean(u.Path), Prefix: DefaultPrefix}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return bad("query: %v", err)
	}
	for name, vals := range q {
		if len(vals) != 1 {
			return bad("parameter %s given %d times", name, len(vals))
		}
		v := vals[0]
		switch name {
		case "capacity":
			if c.Capacity, err = ParseBytes(v); err != nil {
				return bad("capacity: %v", err)
			}
		case "prefix":
			if c.Prefix, err = cleanPrefix(v); err != nil {
				return bad("prefix: %v", err)
			}
		case "sweep":
			if c.SweepInterval, err = time.ParseDuration(v); err != nil || c.SweepInterval <= 0 {
				return bad("sweep: want a positive duration such as 30s, got %q", v)
			}
		case "parallel":
			if c.Parallel, err = strconv.Atoi(v); err != nil || c.Parallel < 1 || c.Parallel > 256 {
				return bad("parallel: want 1..256, got %q", v)
			}
		default:
			return bad("unknown parameter %q (known: capacity, prefix, sweep, parallel)", name)
		}
	}
	return c, nil
}

// cleanPrefix accepts a relative path that stays below the root and returns
// it with a trailing slash ("" stays "").
func cleanPrefix(p string) (string, error) {
	if p == "" {
		return "", nil
	}
	if path.IsAbs(p) {
		return "", fmt.Errorf("%q must be relative", p)
	}
	c := path.Clean(p)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("%q leaves the root", p)
	}
	if c == "." {
		return "", nil
	}
	return c + "/", nil
}

var units = []struct {
	suffix string
	scale  float64
}{
	// Longest suffixes first, so "MiB" is not read as "B".
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"b", 1},
}

// ParseBytes reads a byte count such as "10GiB", "1.5TB", "4096" or
// "512 MiB". Units are case-insensitive; bare numbers are bytes.
func ParseBytes(s string) (int64, error) {
	num := strings.TrimSpace(s)
	scale := 1.0
	lower := strings.ToLower(num)
	for _, u := range units {
		if strings.HasSuffix(lower, u.suffix) {
			num, scale = strings.TrimSpace(num[:len(num)-len(u.suffix)]), u.scale
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(v) || v < 0 {
		return 0, fmt.Errorf("bad byte count %q (want e.g. 10GiB, 500MB, 4096)", s)
	}
	b := v * scale
	if b >= math.MaxInt64 {
		return 0, fmt.Errorf("byte count %q is too large", s)
	}
	return int64(b), nil
}
