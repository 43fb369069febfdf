// Package redisindex is a block index for kvtier's router kept in Redis, so
// that several router replicas behind a load balancer share one view of
// which pod holds which KV block. It implements index.Store.
//
// # Data model
//
// For each block, a hash keyed by the block's event hash:
//
//	<prefix>b:<16 hex digits>   field: pod name   value: tier bitmask (bit t = index.Tier t)
//
// and for each pod, the set of its blocks, so a pod can be cleared:
//
//	<prefix>p:<pod name>        members: 16 hex digits
//
// Pods are stored by name: pod ids are local to each replica's index.Pods,
// and a name first seen in Redis (written by another replica) is interned
// locally when read. Updates run as Lua scripts, one round trip per batch,
// so a bitmask's read-modify-write and the pod's set change together.
// Block keys expire TTL after their last update (default 24 h), so entries
// of pods that vanished without a clear age out instead of growing Redis
// forever; pod sets expire alike.
//
// Scripts build their keys from the prefix, which Redis Cluster forbids:
// use a standalone or Sentinel-managed Redis (or Valkey).
//
// Scoring reads one Redis hash per prompt block. Snapshot fetches all of a
// prompt's blocks in one pipeline into an in-memory Store, which the score
// API uses when the index offers it (index.Snapshotter), so a score costs
// one round trip rather than one per block.
package redisindex

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/router/index"
)

// Config configures an Index.
type Config struct {
	// Client talks to Redis; the caller owns it and closes it.
	Client goredis.UniversalClient
	// Prefix starts every key (default "kvtier:").
	Prefix string
	// TTL is how long a block's entry lives after its last update
	// (default 24 h).
	TTL time.Duration
	// Timeout bounds each call (default 2 s).
	Timeout time.Duration
}

// Index is an index.Store in Redis. Safe for concurrent use.
type Index struct {
	rdb     goredis.UniversalClient
	pods    *index.Pods
	prefix  string
	ttl     time.Duration
	timeout time.Duration

	errors atomic.Uint64 // failed reads, which reads report as "no holders"
}

var _ index.Store = (*Index)(nil)

// New returns an Index over cfg.Client, naming pods through pods.
func New(cfg Config, pods *index.Pods) (*Index, error) {
	if cfg.Client == nil || pods == nil {
		return nil, errors.New("redisindex: a Redis client and a pod registry are required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "kvtier:"
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 24 * time.Hour
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	return &Index{rdb: cfg.Client, pods: pods, prefix: cfg.Prefix, ttl: cfg.TTL, timeout: cfg.Timeout}, nil
}

// Errors counts reads that failed (and answered "no holders").
func (ix *Index) Errors() uint64 { return ix.errors.Load() }

func (ix *Index) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), ix.timeout)
}

func (ix *Index) blockKey(h uint64) string { return ix.prefix + "b:" + hex16(h) }

func hex16(h uint64) string {
	s := strconv.FormatUint(h, 16)
	for len(s) < 16 {
		s = "0" + s
	}
	return s
}

// update ORs bits into (set) or clears bits from each block's mask for
// pod, keeping the pod's block set in step. ARGV: prefix, pod, bits,
// ttl ms, set (1) or clear (0), then the blocks' hex hashes.
var update = goredis.NewScript(`
local prefix, pod, bits, ttl, set = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5] == '1'
local podkey = prefix .. 'p:' .. pod
for i = 6, #ARGV do
  local bkey = prefix .. 'b:' .. ARGV[i]
  local mask = tonumber(redis.call('HGET', bkey, pod) or '0')
  if set then
    mask = bit.bor(mask, bits)
  else
    mask = bit.band(mask, bit.bnot(bits))
  end
  if mask == 0 then
    redis.call('HDEL', bkey, pod)
    redis.call('SREM', podkey, ARGV[i])
  else
    redis.call('HSET', bkey, pod, mask)
    redis.call('PEXPIRE', bkey, ttl)
    redis.call('SADD', podkey, ARGV[i])
  end
end
if redis.call('EXISTS', podkey) == 1 then redis.call('PEXPIRE', podkey, ttl) end
return 0
`)

// clearPod clears bits from every block of pod. ARGV: prefix, pod, bits.
var clearPod = goredis.NewScript(`
local prefix, pod, bits = ARGV[1], ARGV[2], tonumber(ARGV[3])
local podkey = prefix .. 'p:' .. pod
for _, h in ipairs(redis.call('SMEMBERS', podkey)) do
  local bkey = prefix .. 'b:' .. h
  local mask = bit.band(tonumber(redis.call('HGET', bkey, pod) or '0'), bit.bnot(bits))
  if mask == 0 then
    redis.call('HDEL', bkey, pod)
    redis.call('SREM', podkey, h)
  else
    redis.call('HSET', bkey, pod, mask)
  end
end
return 0
`)

func (ix *Index) podName(pod index.PodID) (string, error) {
	name, ok := ix.pods.Name(pod)
	if !ok {
		return "", fmt.Errorf("redisindex: pod id %d is not registered", pod)
	}
	return name, nil
}

func (ix *Index) change(pod index.PodID, tier index.Tier, hashes []uint64, set bool) error {
	if tier >= index.NumTiers {
		return fmt.Errorf("redisindex: %w: %d", index.ErrBadTier, tier)
	}
	if len(hashes) == 0 {
		return nil
	}
	name, err := ix.podName(pod)
	if err != nil {
		return err
	}
	args := make([]any, 0, 5+len(hashes))
	flag := "0"
	if set {
		flag = "1"
	}
	args = append(args, ix.prefix, name, 1<<tier, ix.ttl.Milliseconds(), flag)
	for _, h := range hashes {
		args = append(args, hex16(h))
	}
	ctx, cancel := ix.ctx()
	defer cancel()
	if err := update.Run(ctx, ix.rdb, nil, args...).Err(); err != nil && !errors.Is(err, goredis.Nil) {
		return fmt.Errorf("redisindex: %w", err)
	}
	return nil
}

// Add implements index.Store.
func (ix *Index) Add(pod index.PodID, tier index.Tier, hashes []uint64) error {
	return ix.change(pod, tier, hashes, true)
}

// Remove implements index.Store.
func (ix *Index) Remove(pod index.PodID, tier index.Tier, hashes []uint64) error {
	return ix.change(pod, tier, hashes, false)
}

func (ix *Index) clear(pod index.PodID, bits int) error {
	name, err := ix.podName(pod)
	if err != nil {
		return err
	}
	ctx, cancel := ix.ctx()
	defer cancel()
	if err := clearPod.Run(ctx, ix.rdb, nil, ix.prefix, name, bits).Err(); err != nil && !errors.Is(err, goredis.Nil) {
		return fmt.Errorf("redisindex: %w", err)
	}
	return nil
}

// ClearPod implements index.Store. A failure is counted (Errors): the
// interface has no error, and the entries then age out with their TTL.
func (ix *Index) ClearPod(pod index.PodID) {
	if ix.clear(pod, 1<<index.NumTiers-1) != nil {
		ix.errors.Add(1)
	}
}

// ClearPodTier implements index.Store.
func (ix *Index) ClearPodTier(pod index.PodID, tier index.Tier) error {
	if tier >= index.NumTiers {
		return fmt.Errorf("redisindex: %w: %d", index.ErrBadTier, tier)
	}
	return ix.clear(pod, 1<<tier)
}

// HolderWords implements index.Store with one HGETALL. A failed read
// counts in Errors and reads as no holders.
func (ix *Index) HolderWords(h uint64, dst []uint32) []uint32 {
	ctx, cancel := ix.ctx()
	defer cancel()
	m, err := ix.rdb.HGetAll(ctx, ix.blockKey(h)).Result()
	if err != nil {
		ix.errors.Add(1)
		return dst
	}
	return ix.appendWords(dst, m)
}

// appendWords turns a block's (pod name → mask) fields into holder words.
func (ix *Index) appendWords(dst []uint32, m map[string]string) []uint32 {
	for name, v := range m {
		mask, err := strconv.ParseUint(v, 10, 32)
		if err != nil || mask == 0 {
			continue // not ours: ignore rather than guess
		}
		id, err := ix.pods.Intern(name)
		if err != nil {
			continue
		}
		dst = append(dst, index.HolderWord(id, uint32(mask)))
	}
	return dst
}

// Lookup implements index.Store: it fetches every block in one pipeline,
// then visits them in order.
func (ix *Index) Lookup(hashes []uint64, buf []index.Entry, visit func(i int, holders []index.Entry) bool) []index.Entry {
	snap, err := ix.Snapshot(hashes)
	if err != nil {
		snap = &Snapshot{}
	}
	return snap.Lookup(hashes, buf, visit)
}

// Snapshot reads the holders of every block of hashes in one pipeline and
// returns them as a read-only Store for scoring.
func (ix *Index) Snapshot(hashes []uint64) (index.Store, error) {
	ctx, cancel := ix.ctx()
	defer cancel()
	pipe := ix.rdb.Pipeline()
	cmds := make([]*goredis.MapStringStringCmd, len(hashes))
	for i, h := range hashes {
		cmds[i] = pipe.HGetAll(ctx, ix.blockKey(h))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, goredis.Nil) {
		ix.errors.Add(1)
		return &Snapshot{}, fmt.Errorf("redisindex: %w", err)
	}
	s := &Snapshot{words: make(map[uint64][]uint32, len(hashes))}
	for i, h := range hashes {
		if w := ix.appendWords(nil, cmds[i].Val()); len(w) > 0 {
			s.words[h] = w
		}
	}
	return s, nil
}

// Snapshot is a read-only Store of the blocks one Snapshot call read.
// Writes are refused.
type Snapshot struct{ words map[uint64][]uint32 }

var errReadOnly = errors.New("redisindex: a snapshot is read-only")

func (s *Snapshot) Add(index.PodID, index.Tier, []uint64) error    { return errReadOnly }
func (s *Snapshot) Remove(index.PodID, index.Tier, []uint64) error { return errReadOnly }
func (s *Snapshot) ClearPod(index.PodID)                           {}
func (s *Snapshot) ClearPodTier(index.PodID, index.Tier) error     { return errReadOnly }

// HolderWords implements index.Store.
func (s *Snapshot) HolderWords(h uint64, dst []uint32) []uint32 { return append(dst, s.words[h]...) }

// Lookup implements index.Store.
func (s *Snapshot) Lookup(hashes []uint64, buf []index.Entry, visit func(i int, holders []index.Entry) bool) []index.Entry {
	for i, h := range hashes {
		buf = buf[:0]
		for _, w := range s.words[h] {
			pod, tiers := index.HolderOf(w)
			for t := index.Tier(0); t < index.NumTiers; t++ {
				if tiers&(1<<t) != 0 {
					buf = append(buf, index.Entry{Pod: pod, Tier: t})
				}
			}
		}
		if !visit(i, buf) {
			break
		}
	}
	return buf
}
