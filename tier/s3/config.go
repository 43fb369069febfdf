package s3

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/minio/minio-go/v7/pkg/s3utils"

	"kvtier/tier/remote"
)

// DefaultPrefix is prepended to every object name when the URL names no
// prefix, so a bucket shared with other data keeps kvtier's objects apart.
const DefaultPrefix = "kvtier/"

// defaultEndpoint is AWS S3; minio-go finds the bucket's region from it.
const defaultEndpoint = "s3.amazonaws.com"

// ErrBadURL is wrapped by every error ParseURL returns.
var ErrBadURL = errors.New("s3: bad URL")

// Config says where the tier keeps its objects and how it reaches them.
type Config struct {
	Bucket       string
	Prefix       string // prepended to object names; DefaultPrefix if empty
	Endpoint     string // host[:port]; AWS S3 if empty
	Region       string // empty lets the client ask the server
	Secure       bool   // HTTPS
	PathStyle    bool   // bucket in the path rather than the host name
	CreateBucket bool   // create the bucket when it is missing
	LayerRanges  bool   // layerwise loads read a layer at a time (Range GETs) rather than whole objects

	AccessKey    string
	SecretKey    string
	SessionToken string

	Timeout     time.Duration // round-trip bound of each operation; DefaultTimeout if zero
	Bandwidth   int64         // bytes/s a GET or PUT is allowed at least; DefaultBandwidth if zero
	CacheKeys   int           // presence cache size; DefaultCacheKeys if zero
	Parallelism int           // concurrent HEADs in PrefixContains; DefaultParallelism if zero
	Logger      *slog.Logger  // slog.Default() if nil
}

// Defaults for the zero fields of Config.
const (
	DefaultTimeout     = remote.DefaultTimeout
	DefaultBandwidth   = remote.DefaultBandwidth
	openTimeout        = 10 * time.Second // checking the bucket when the tier opens
	DefaultCacheKeys   = 1 << 16
	DefaultParallelism = 8
)

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Endpoint == "" {
		c.Endpoint = defaultEndpoint
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Bandwidth <= 0 {
		c.Bandwidth = DefaultBandwidth
	}
	if c.CacheKeys <= 0 {
		c.CacheKeys = DefaultCacheKeys
	}
	if c.Parallelism <= 0 {
		c.Parallelism = DefaultParallelism
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// ParseURL reads a Config from a URL of the form
//
//	s3://[access:secret@]bucket[/prefix]?endpoint=host:port&region=r&secure=false&path_style=true&create=true&layer_ranges=true
//
// All query parameters are optional; unknown ones are rejected so a typo
// does not silently fall back to a default. Credentials come from the URL's
// user information when it has any, else from AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN (see the package comment).
func ParseURL(u *url.URL) (Config, error) {
	var c Config
	if !strings.EqualFold(u.Scheme, "s3") {
		return c, fmt.Errorf("%w: scheme %q, want s3", ErrBadURL, u.Scheme)
	}
	c.Bucket = u.Host
	if c.Bucket == "" {
		return c, fmt.Errorf("%w: no bucket (want s3://bucket/prefix)", ErrBadURL)
	}
	if err := s3utils.CheckValidBucketNameStrict(c.Bucket); err != nil {
		return c, fmt.Errorf("%w: bucket %q: %v", ErrBadURL, c.Bucket, err)
	}
	c.Prefix = prefixFromPath(u.Path)
	if err := parseQuery(&c, u.Query()); err != nil {
		return c, err
	}
	if err := parseCredentials(&c, u.User); err != nil {
		return c, err
	}
	return c, nil
}

// prefixFromPath turns "/a/b" into "a/b/": object names are then
// "a/b/<key>", which list as a folder in every S3 browser.
func prefixFromPath(path string) string {
	p := strings.Trim(path, "/")
	if p == "" {
		return DefaultPrefix
	}
	return p + "/"
}

func parseQuery(c *Config, q url.Values) error {
	c.Secure = true
	for name, values := range q {
		v := values[len(values)-1]
		var err error
		switch name {
		case "endpoint":
			c.Endpoint = v
			if strings.Contains(v, "://") || strings.Contains(v, "/") {
				err = errors.New("want host or host:port, no scheme or path (use secure=false for http)")
			}
		case "region":
			c.Region = v
		case "secure":
			c.Secure, err = strconv.ParseBool(v)
		case "path_style":
			c.PathStyle, err = strconv.ParseBool(v)
		case "create":
			c.CreateBucket, err = strconv.ParseBool(v)
		case "layer_ranges":
			c.LayerRanges, err = strconv.ParseBool(v)
		default:
			err = errors.New("unknown parameter (known: endpoint, region, secure, path_style, create, layer_ranges)")
		}
		if err != nil {
			return fmt.Errorf("%w: %s=%q: %v", ErrBadURL, name, v, err)
		}
	}
	return nil
}

// parseCredentials applies the precedence documented in the package
// comment: the URL wins as a whole; the environment is used only when the
// URL has no user information at all, so the two are never mixed.
func parseCredentials(c *Config, user *url.Userinfo) error {
	if user != nil {
		secret, ok := user.Password()
		if user.Username() == "" || !ok || secret == "" {
			return fmt.Errorf("%w: credentials in the URL need both parts, as access:secret@bucket", ErrBadURL)
		}
		c.AccessKey, c.SecretKey = user.Username(), secret
		return nil
	}
	c.AccessKey = os.Getenv("AWS_ACCESS_KEY_ID")
	c.SecretKey = os.Getenv("AWS_SECRET_ACCESS_KEY")
	c.SessionToken = os.Getenv("AWS_SESSION_TOKEN")
	if c.AccessKey == "" || c.SecretKey == "" {
		return fmt.Errorf("%w: no credentials: put access:secret@ in the URL or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", ErrBadURL)
	}
	return nil
}
