// Package tier defines the storage hierarchy behind kvtier's engine: the
// Tier interface every level implements (RAM, disk, remote stores) and the
// Manager that writes to all of them, reads waterfall from the fastest,
// promotes hits into RAM and prefetches whole prefixes.
package tier

import (
	"context"
	"errors"
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

// Tier is one level of the hierarchy. All methods are safe for concurrent
// use. Put is synchronous at this level: the Manager makes writes to lower
// tiers asynchronous, with one bounded queue per tier, so every tier gets
// the same backpressure rules without reimplementing them.
type Tier interface {
	// Name is a short stable name ("mem", "disk", "redis", ...).
	Name() string
	// Contains reports whether key is stored and readable.
	Contains(key chunk.Key) bool
	// PrefixContains returns how many leading keys are all stored.
	PrefixContains(keys []chunk.Key) int
	// Size returns the stored object's length in bytes.
	Size(key chunk.Key) (int, bool)
	// Get copies the object into dst, which must be at least Size bytes,
	// and returns the number of bytes written. A missing key gives
	// ErrNotFound; an object that fails validation gives ErrCorrupt and is
	// dropped by the tier.
	Get(ctx context.Context, key chunk.Key, dst []byte) (int, error)
	// Put stores data under key. data is only read during the call. Putting
	// a key that is already stored is a no-op success.
	Put(ctx context.Context, key chunk.Key, data []byte) error
	// Remove deletes key and reports whether it was there.
	Remove(key chunk.Key) bool
	// Pin protects the leading stored keys from eviction until ttl passes
	// and returns how many leading keys it pinned. Pins are leases: they
	// lapse on their own, so a caller that dies cannot leak space.
	Pin(keys []chunk.Key, ttl time.Duration) int
	// Stats returns a snapshot of the tier's counters.
	Stats() Stats
	// Close flushes pending work and releases resources.
	Close() error
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
