// Package redisindex is a block index for kvtier's router kept in Redis
// (or Valkey), so that several router replicas behind a load balancer share
// one view of which pod holds which KV block in which tier. It implements
// index.Store with the same semantics as the in-memory index.Index.
//
// # Data model
//
// Pod ids are local to each replica's index.Pods, so Redis holds pod names;
// a name first read from Redis (written by another replica) is interned
// into the local registry. With the default prefix "kvtier:":
//
//	kvtier:b:<16 hex digits of the block hash>   hash
//	    field: pod name    value: tier bitmask in decimal (bit t = index.Tier t)
//	kvtier:p:<pod name>                          sorted set
//	    member: 16 hex digits of a block    score: last Add of that holding, Unix ms
//	kvtier:pods                                  sorted set
//	    member: pod name    score: the pod's last Add, Unix ms
//
// The block hash is what scoring reads: one HGETALL answers a block's
// holders. The pod's sorted set is the reverse index that ClearPod and
// ClearPodTier walk, and its scores say when each holding was last
// refreshed, which is what expiry needs. The registry lists the pods that
// have holdings, so expiry can find them.
//
// # Consistency
//
// A bitmask update is a read-modify-write and must change the pod's set in
// the same step, so every write is a Lua script (EVALSHA, loaded on first
// use): Add and Remove of a batch are one script call, one round trip,
// atomic in Redis. Hashes travel as one binary argument (8 bytes each,
// big-endian) and scripts build the keys, so a batch costs the client no
// allocation per block. ClearPod and ClearPodTier walk the pod's set in
// chunks of ClearChunk blocks, one script call each, so clearing a pod with
// a million blocks never stalls Redis for other replicas; a write racing a
// clear of the same pod lands before or after each chunk.
//
// # Expiry (the memory bound)
//
// The in-memory index is bounded by a block count; this one is bounded by
// age. A (block, pod) holding that no Add has refreshed for Config.TTL
// (default 24 h) is stale: Reap deletes stale holdings of every pod in the
// registry, so holdings of pods that vanished without an AllBlocksCleared
// age out even from blocks that live pods keep refreshing. Writes run Reap
// themselves at most every TTL/16, so stale holdings live at most
// TTL × 17/16 plus the gap to the next write. As a backstop, a block key
// expires TTL after its last Add and pod sets and the registry 2×TTL after
// their pod's last Add. Redis memory is therefore bounded by the blocks
// added within the last TTL: about 200 bytes per (block, pod) holding,
// all three structures included, measured with 4 pods per block
// (BenchmarkMemoryPerHolding), so size TTL to the add rate. A
// maxmemory limit with a volatile-* eviction policy is a hard cap on top.
// A negative TTL turns expiry off. Clocks: the writers' clocks stamp the
// holdings; replicas' skew only shifts expiry by the skew.
//
// # Reads
//
// Scorers read a prompt block by block (HolderWords), which over the
// network would cost a round trip per block. ScoreWith and Snapshot
// (index.Snapshotter) read every block of a prompt with one pipeline of
// HGETALLs, then score from a local read-only copy (see fill for why not
// a script). HolderWords and Lookup also cost one round trip
// each. Read errors cannot be returned through index.Store: they count in
// Stats.ReadErrors and read as "no holders".
//
// # Redis Cluster
//
// Scripts name their keys themselves, which Redis Cluster allows only
// within the slot a call is routed to. In cluster mode every key therefore
// carries one hash tag (the default prefix becomes "{kvtier}:"), which puts
// the whole index on one shard: the cluster gives failover, not capacity.
package redisindex

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/router/index"
)

// Defaults for Config's zero fields.
const (
	DefaultPrefix        = "kvtier:"
	DefaultClusterPrefix = "{kvtier}:"
	DefaultTTL           = 24 * time.Hour
	DefaultTimeout       = 2 * time.Second
	// ClearChunk is how many of a pod's blocks one clear or reap script
	// call handles: about a millisecond of Redis time.
	ClearChunk = 1000
)

// ErrBadConfig is returned by New for an unusable Config.
var ErrBadConfig = errors.New("redisindex: bad config")

// Config configures an Index.
type Config struct {
	// URL of the Redis server, redis://[user:pass@]host:port[/db] or
	// rediss:// for TLS; used when Client is nil. The Index then owns the
	// client and Close closes it.
	URL string
	// Cluster reads URL as Redis Cluster seed nodes
	// (redis://host:port?addr=host2:port2).
	Cluster bool
	// Client, when set, is used instead of URL; the caller owns it.
	Client goredis.UniversalClient
	// Prefix starts every key: DefaultPrefix, or DefaultClusterPrefix for
	// a cluster client, where it must contain a hash tag ("{...}").
	Prefix string
	// TTL is how long a holding lives after its last Add: 0 means
	// DefaultTTL, negative means forever.
	TTL time.Duration
	// Timeout bounds each Redis call; 0 means DefaultTimeout.
	Timeout time.Duration
}

// Stats counts what the Index could not report through index.Store.
type Stats struct {
	ReadErrors  uint64 // reads that failed and answered "no holders"
	ClearErrors uint64 // ClearPod calls that failed (ClearPod returns no error)
	ReapErrors  uint64 // Reap runs started by writes that failed
	Reaped      uint64 // stale holdings this Index deleted
}

// Index is an index.Store in Redis. It is safe for concurrent use; each
// method holds no lock across its Redis call.
type Index struct {
	rdb      goredis.UniversalClient
	ownsRDB  bool
	pods     *index.Pods
	prefix   string
	registry string // key of the pod registry; routes scripts in a cluster
	ttl      time.Duration
	timeout  time.Duration
	now      func() time.Time // replaced by tests

	namesMu   sync.RWMutex
	names     map[string]index.PodID // skips Intern for names read before
	snapshots sync.Pool
	blobs     sync.Pool // *[]byte: hashes encoded for a script

	lastReap atomic.Int64 // Unix ms of the last Reap started by a write

	readErrors, clearErrors, reapErrors, reaped atomic.Uint64
}

var (
	_ index.Store       = (*Index)(nil)
	_ index.Snapshotter = (*Index)(nil)
)

// New returns an Index over Redis as cfg says, naming pods through pods.
func New(cfg Config, pods *index.Pods) (*Index, error) {
	if pods == nil {
		return nil, fmt.Errorf("%w: a pod registry is required", ErrBadConfig)
	}
	rdb, owns, err := client(cfg)
	if err != nil {
		return nil, err
	}
	prefix, err := keyPrefix(cfg.Prefix, rdb)
	if err != nil {
		if owns {
			rdb.Close()
		}
		return nil, err
	}
	ix := &Index{
		rdb: rdb, ownsRDB: owns, pods: pods,
		prefix: prefix, registry: prefix + "pods",
		ttl: cfg.TTL, timeout: cfg.Timeout, now: time.Now,
		names: make(map[string]index.PodID),
	}
	if ix.ttl == 0 {
		ix.ttl = DefaultTTL
	}
	if ix.timeout <= 0 {
		ix.timeout = DefaultTimeout
	}
	ix.snapshots.New = func() any { return newSnapshot() }
	ix.blobs.New = func() any { return new([]byte) }
	return ix, nil
}

// client returns the client cfg names and whether New opened it.
func client(cfg Config) (goredis.UniversalClient, bool, error) {
	switch {
	case cfg.Client != nil:
		return cfg.Client, false, nil
	case cfg.URL == "":
		return nil, false, fmt.Errorf("%w: neither URL nor Client set", ErrBadConfig)
	case cfg.Cluster:
		opts, err := goredis.ParseClusterURL(cfg.URL)
		if err != nil {
			return nil, false, fmt.Errorf("%w: cluster URL: %w", ErrBadConfig, err)
		}
		return goredis.NewClusterClient(opts), true, nil
	default:
		opts, err := goredis.ParseURL(cfg.URL)
		if err != nil {
			return nil, false, fmt.Errorf("%w: URL: %w", ErrBadConfig, err)
		}
		return goredis.NewClient(opts), true, nil
	}
}

// keyPrefix applies the default prefix and, for a cluster, checks that it
// pins every key to one slot.
func keyPrefix(prefix string, rdb goredis.UniversalClient) (string, error) {
	_, cluster := rdb.(*goredis.ClusterClient)
	switch {
	case prefix == "" && cluster:
		return DefaultClusterPrefix, nil
	case prefix == "":
		return DefaultPrefix, nil
	case cluster && !hasHashTag(prefix):
		return "", fmt.Errorf("%w: prefix %q has no hash tag ({...}), which Redis Cluster needs", ErrBadConfig, prefix)
	}
	return prefix, nil
}

// hasHashTag reports whether s holds a Redis Cluster hash tag: a "{"
// followed later by "}" with something between.
func hasHashTag(s string) bool {
	open := strings.IndexByte(s, '{')
	if open < 0 {
		return false
	}
	end := strings.IndexByte(s[open+1:], '}')
	return end > 0
}

// Close closes the Redis client if New opened it from Config.URL.
func (ix *Index) Close() error {
	if !ix.ownsRDB {
		return nil
	}
	return ix.rdb.Close()
}

// Stats returns the Index's counters.
func (ix *Index) Stats() Stats {
	return Stats{
		ReadErrors:  ix.readErrors.Load(),
		ClearErrors: ix.clearErrors.Load(),
		ReapErrors:  ix.reapErrors.Load(),
		Reaped:      ix.reaped.Load(),
	}
}

func (ix *Index) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), ix.timeout)
}

func (ix *Index) podName(pod index.PodID) (string, error) {
	name, ok := ix.pods.Name(pod)
	if !ok {
		return "", fmt.Errorf("redisindex: pod id %d is not registered", pod)
	}
	return name, nil
}

// podID resolves a pod name read from Redis to a local id, interning names
// another replica wrote. The cache is checked against the registry
// because index.Pods reuses the ids of removed pods.
func (ix *Index) podID(name string) (index.PodID, bool) {
	ix.namesMu.RLock()
	id, ok := ix.names[name]
	ix.namesMu.RUnlock()
	if ok {
		if cur, ok := ix.pods.Name(id); ok && cur == name {
			return id, true
		}
	}
	name = strings.Clone(name) // name may point into a large reply
	id, err := ix.pods.Intern(name)
	if err != nil {
		return 0, false
	}
	ix.namesMu.Lock()
	ix.names[name] = id
	ix.namesMu.Unlock()
	return id, true
}

// encodeHashes writes hashes into a pooled buffer as a script argument.
func (ix *Index) encodeHashes(hashes []uint64) *[]byte {
	buf := ix.blobs.Get().(*[]byte)
	b := (*buf)[:0]
	for _, h := range hashes {
		b = append(b, byte(h>>56), byte(h>>48), byte(h>>40), byte(h>>32),
			byte(h>>24), byte(h>>16), byte(h>>8), byte(h))
	}
	*buf = b
	return buf
}

func (ix *Index) ttlMillis() int64 {
	if ix.ttl < 0 {
		return 0
	}
	return ix.ttl.Milliseconds()
}
