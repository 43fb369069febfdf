package redis

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"kvtier/tier/remote"
)

// Topology is how the tier reaches its servers.
type Topology int

const (
	Standalone Topology = iota // one server (or a proxy in front of many)
	Cluster                    // Redis Cluster: keys spread over slots
	Sentinel                   // a master found through Sentinel
)

// Defaults for the URL's query parameters.
const (
	DefaultPrefix     = "kvtier/"
	DefaultCacheSlots = 1 << 16
	defaultPort       = "6379"
	defaultSentinel   = "26379"
	// maxValue is Redis' default proto-max-bulk-len: larger SETs are refused.
	maxValue = 512 << 20
)

// config is everything a URL says about one tier.
type config struct {
	topology   Topology
	addrs      []string // host:port of the server, cluster seeds or sentinels
	master     string   // Sentinel master name
	db         int
	user, pass string
	tls        *tls.Config // nil for plain TCP
	prefix     string
	pool       int           // connections per server; 0 takes go-redis' default
	ttl        time.Duration // 0 keeps objects until Redis evicts them
	cacheSlots int           // entries of the presence cache; 0 disables it
	noStage    bool          // layer_saves=false: per-layer saves write whole chunks
}

// scheme forms accepted, by scheme name.
var schemes = map[string]struct {
	topology Topology
	tls      bool
}{
	"redis":            {Standalone, false},
	"rediss":           {Standalone, true},
	"redis+cluster":    {Cluster, false},
	"rediss+cluster":   {Cluster, true},
	"redis+sentinel":   {Sentinel, false},
	"rediss+sentinel":  {Sentinel, true},
	"valkey":           {Standalone, false},
	"valkeys":          {Standalone, true},
	"valkey+cluster":   {Cluster, false},
	"valkeys+cluster":  {Cluster, true},
	"valkey+sentinel":  {Sentinel, false},
	"valkeys+sentinel": {Sentinel, true},
}

// parseURL reads a tier URL; see the package documentation for its forms.
func parseURL(u *url.URL) (config, error) {
	form, ok := schemes[strings.ToLower(u.Scheme)]
	if !ok {
		return config{}, badURL(u, "scheme %q is not a redis scheme", u.Scheme)
	}
	c := config{topology: form.topology, prefix: DefaultPrefix, cacheSlots: DefaultCacheSlots}
	if u.Opaque != "" || u.Host == "" {
		return config{}, badURL(u, "no host (want %s://host:port)", u.Scheme)
	}
	if u.User != nil {
		c.user = u.User.Username()
		c.pass, _ = u.User.Password()
	}
	var err error
	if c.addrs, err = hostList(u, form.topology); err != nil {
		return config{}, err
	}
	if err = c.parsePath(u); err != nil {
		return config{}, err
	}
	if err = c.parseQuery(u, form.tls); err != nil {
		return config{}, err
	}
	return c, nil
}

// hostList splits "h1:p1,h2:p2" and fills in default ports. Only cluster
// seeds and sentinels may be several.
func hostList(u *url.URL, topo Topology) ([]string, error) {
	port := defaultPort
	if topo == Sentinel {
		port = defaultSentinel
	}
	hosts := strings.Split(u.Host, ",")
	if topo == Standalone && len(hosts) > 1 {
		return nil, badURL(u, "several hosts need %s+cluster:// or %s+sentinel://", u.Scheme, u.Scheme)
	}
	addrs := make([]string, 0, len(hosts))
	for _, h := range hosts {
		if h == "" {
			return nil, badURL(u, "empty host in %q", u.Host)
		}
		host, p, err := net.SplitHostPort(h)
		if err != nil { // no port given
			host, p = h, port
		}
		if n, err := strconv.Atoi(p); err != nil || n <= 0 || n > 65535 {
			return nil, badURL(u, "bad port in %q", h)
		}
		addrs = append(addrs, net.JoinHostPort(host, p))
	}
	return addrs, nil
}

// parsePath reads "/db" (standalone), nothing (cluster: one database only)
// or "/master[/db]" (sentinel).
func (c *config) parsePath(u *url.URL) error {
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	if parts[0] == "" {
		parts = nil
	}
	if c.topology == Sentinel {
		if len(parts) == 0 {
			return badURL(u, "sentinel URL needs the master name as its path")
		}
		c.master, parts = parts[0], parts[1:]
	}
	switch {
	case len(parts) == 0:
		return nil
	case len(parts) > 1:
		return badURL(u, "path %q has too many parts", u.Path)
	case c.topology == Cluster:
		return badURL(u, "Redis Cluster has only database 0; drop the path %q", u.Path)
	}
	db, err := strconv.Atoi(parts[0])
	if err != nil || db < 0 {
		return badURL(u, "database %q is not a number", parts[0])
	}
	c.db = db
	return nil
}

// parseQuery reads the tuning parameters. Unknown ones are errors: a typo
// must not silently fall back to a default.
func (c *config) parseQuery(u *url.URL, useTLS bool) error {
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return badURL(u, "query: %v", err)
	}
	var caFile, certFile, keyFile string
	for name, vals := range q {
		v := vals[len(vals)-1]
		switch name {
		case "prefix":
			c.prefix = v
		case "pool":
			c.pool, err = positive(v)
		case "cache":
			c.cacheSlots, err = strconv.Atoi(v)
			if err == nil && c.cacheSlots < 0 {
				err = fmt.Errorf("negative")
			}
		case "ttl":
			c.ttl, err = time.ParseDuration(v)
			if err == nil && c.ttl < time.Millisecond {
				err = fmt.Errorf("below 1ms")
			}
		case "layer_saves":
			var on bool
			on, err = strconv.ParseBool(v)
			c.noStage = !on
		case "ca":
			caFile = v
		case "cert":
			certFile = v
		case "key":
			keyFile = v
		default:
			return badURL(u, "unknown parameter %q", name)
		}
		if err != nil {
			return badURL(u, "parameter %s=%q: %v", name, v, err)
		}
	}
	if !useTLS {
		if caFile != "" || certFile != "" || keyFile != "" {
			return badURL(u, "ca, cert and key need a TLS scheme (%ss://)", u.Scheme)
		}
		return nil
	}
	c.tls, err = tlsConfig(caFile, certFile, keyFile)
	if err != nil {
		return badURL(u, "%v", err)
	}
	return nil
}

func positive(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err == nil && n <= 0 {
		err = fmt.Errorf("must be positive")
	}
	return n, err
}

// tlsConfig trusts the system roots, or only caFile when given, and
// presents the client certificate certFile/keyFile when given. The server
// name is filled in by go-redis from each address it dials.
func tlsConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca: no PEM certificate in %s", caFile)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("cert and key go together")
	}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

func badURL(u *url.URL, format string, args ...any) error {
	return fmt.Errorf("%w %q: %s", remote.ErrBadURL, u.Redacted(), fmt.Sprintf(format, args...))
}
