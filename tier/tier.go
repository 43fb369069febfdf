// Package tier defines the storage hierarchy behind kvtier's engine: the
// Tier interface every level implements (RAM, disk, remote stores) and the
// Manager that writes to all of them, reads waterfall from the fastest,
// promotes hits into RAM and prefetches whole prefixes.
package tier

import (
	"context"
	"errors"
	"io"
	"time"

	"kvtier/chunk"
)

// Errors shared by all tiers. Implementations wrap them with %w.
var (
	ErrNotFound = errors.New("tier: not found")
	ErrClosed   = errors.New("tier: closed")
	ErrTooLarge = errors.New("tier: object larger than tier capacity")
	ErrBusy     = errors.New("tier: busy")
	ErrCorrupt  = errors.New("tier: corrupt object")
)

// Tier is one level of the hierarchy: what every store can honestly do,
// from the RAM arena to a bucket shared by a fleet. All methods are safe
// for concurrent use. Put is synchronous at this level: the Manager makes
// writes to lower tiers asynchronous, with one bounded queue per tier, so
// every tier gets the same backpressure rules without reimplementing them.
//
// Everything else a tier may be able to do is an optional interface that
// callers discover with a type assertion, as io.Copy discovers
// io.WriterTo: Remover, PrefixContainer, Container, Pinner, Lister,
// Observable, StatsReporter and io.Closer. A tier that cannot do something
// does not implement it; the helpers below (Remove, PrefixContains,
// Contains, Pin, StatsOf, Close) give the answer that is right for such a
// tier. A type that wraps a tier hides the optional interfaces of what it
// wraps unless it forwards them itself.
type Tier interface {
	// Name is a short stable name ("mem", "disk", "redis", ...).
	Name() string
	// Size reports whether key is stored and readable, and the object's
	// length in bytes.
	Size(key chunk.Key) (int, bool)
	// Get copies the object into dst, which must be at least Size bytes,
	// and returns the number of bytes written. A missing key gives
	// ErrNotFound; an object that fails validation gives ErrCorrupt and is
	// dropped by the tier.
	Get(ctx context.Context, key chunk.Key, dst []byte) (int, error)
	// Put stores data under key. data is only read during the call. Putting
	// a key that is already stored is a no-op success.
	Put(ctx context.Context, key chunk.Key, data []byte) error
}

// ChainPutter is implemented by tiers whose eviction can follow prefix
// chains (a prefix-aware policy, package policy). The manager calls
// PutAfter instead of Put when it knows the chunk's parent: the chunk just
// before it in its prompt.
type ChainPutter interface {
	PutAfter(ctx context.Context, key, parent chunk.Key, data []byte) error
}

// Remover is implemented by tiers that can delete one object. A store
// without per-key deletion (another daemon's protocol) leaves objects to
// its own eviction.
type Remover interface {
	// Remove deletes key and reports whether it was there.
	Remove(key chunk.Key) bool
}

// PrefixContainer is implemented by tiers that check a run of keys at once
// (one lock, one pipeline, one request, parallel stats) instead of one
// Size per key.
type PrefixContainer interface {
	// PrefixContains returns how many leading keys are all stored.
	PrefixContains(keys []chunk.Key) int
}

// Container is implemented by tiers that can tell that a key is stored
// more cheaply than Size can measure it: a tier whose objects are encoded
// must read one to learn its decoded size, but not to know it is there.
type Container interface {
	// Contains reports whether key is stored and readable.
	Contains(key chunk.Key) bool
}

// Pinner is implemented by tiers that can keep objects from eviction for
// a while. Stores that evict on their own terms (Redis, object stores,
// shared directories) cannot. The RAM tier does not either: its chunks are
// held by arena references under the engine's leases, the daemon's one
// lease mechanism, which pins lower tiers through Pin for a lease's TTL.
type Pinner interface {
	// Pin protects the leading stored keys from eviction until ttl passes
	// and returns how many leading keys it pinned. A pin is a deadline and
	// nothing more: it lapses on its own, is never released early, and a
	// caller that dies cannot leak space.
	Pin(keys []chunk.Key, ttl time.Duration) int
}

// ReadOnly is implemented by tiers that only read: the P2P tier, which
// reads other daemons' RAM and disk. The manager never writes to them,
// neither the copies of a store nor those of a promotion, so a daemon's
// writes never land on its peers and a read-only tier costs nothing on
// the write path.
type ReadOnly interface {
	ReadOnly()
}

// NodeLocal is implemented by lower tiers whose objects live on this node
// (the disk tier), unlike shared remote stores and peers. A daemon serves
// its peers from RAM and these tiers only: a peer has the same remote
// stores itself, and two daemons that are each other's peers must not ask
// each other in a loop.
type NodeLocal interface {
	NodeLocal()
}

// StatsReporter is implemented by tiers that keep counters.
type StatsReporter interface {
	// Stats returns a snapshot of the tier's counters.
	Stats() Stats
}

// Remove deletes key from t if t can delete (Remover) and reports whether
// it was there.
func Remove(t Tier, key chunk.Key) bool {
	if r, ok := t.(Remover); ok {
		return r.Remove(key)
	}
	return false
}

// PrefixContains returns how many leading keys t holds: in one call when t
// is a PrefixContainer, else by asking for each key until one is missing.
func PrefixContains(t Tier, keys []chunk.Key) int {
	if p, ok := t.(PrefixContainer); ok {
		return p.PrefixContains(keys)
	}
	for i, k := range keys {
		if !Contains(t, k) {
			return i
		}
	}
	return len(keys)
}

// Contains reports whether t holds key, by Container when t has it and by
// Size otherwise.
func Contains(t Tier, key chunk.Key) bool {
	if c, ok := t.(Container); ok {
		return c.Contains(key)
	}
	_, ok := t.Size(key)
	return ok
}

// Pin pins the leading stored keys in t for ttl and returns how many it
// pinned: none when t cannot pin.
func Pin(t Tier, keys []chunk.Key, ttl time.Duration) int {
	if p, ok := t.(Pinner); ok {
		return p.Pin(keys, ttl)
	}
	return 0
}

// StatsOf returns t's counters, or only its name when it keeps none.
func StatsOf(t Tier) Stats {
	if r, ok := t.(StatsReporter); ok {
		return r.Stats()
	}
	return Stats{Name: t.Name()}
}

// Close closes t if it holds anything to release. A tier with files,
// connections or goroutines implements io.Closer, whose Close flushes
// pending work and releases them.
func Close(t Tier) error {
	if c, ok := t.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// Observer learns which chunks a local tier admits and drops, so that the
// daemon can announce them (as KV events to a router). Its methods may run
// under the tier's lock: they must return at once and never call back into
// a tier.
type Observer interface {
	Admitted(tier string, key chunk.Key)
	Dropped(tier string, key chunk.Key)
}

// Observable is implemented by tiers that report to an Observer.
type Observable interface {
	// SetObserver sets the observer (nil for none).
	SetObserver(Observer)
}

// Lister is implemented by tiers that can enumerate what they hold (the
// local ones; remote stores are shared and may be huge). The admin API
// uses it to list keys by scope.
type Lister interface {
	// List calls fn with each stored key of scope (every key when scope is
	// 0) and its size, in no particular order, until fn returns false. It
	// holds the tier's lock while it runs: fn must be quick and must not
	// call back into the tier.
	List(scope uint64, fn func(key chunk.Key, size int) bool)
}

// Stats is a snapshot of one tier's state and counters since start.
type Stats struct {
	Name         string
	Capacity     int64 // bytes the tier may hold
	Used         int64 // bytes held now
	Objects      int64 // objects held now
	Pinned       int64 // bytes pinned or leased now
	Hits         uint64
	Misses       uint64
	Puts         uint64
	Evictions    uint64
	Removes      uint64
	Corrupt      uint64 // objects dropped because they failed validation
	BytesRead    uint64
	BytesWritten uint64
}
