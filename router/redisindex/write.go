package redisindex

import (
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/router/index"
)

const allTiers = 1<<index.NumTiers - 1

// Add implements index.Store: one script call for the whole batch.
// Adding a holding that exists refreshes its expiry.
func (ix *Index) Add(pod index.PodID, tier index.Tier, hashes []uint64) error {
	if err := ix.update(pod, tier, hashes, true); err != nil {
		return err
	}
	ix.maybeReap()
	return nil
}

// Remove implements index.Store: one script call for the whole batch.
// Unknown blocks and holdings are ignored.
func (ix *Index) Remove(pod index.PodID, tier index.Tier, hashes []uint64) error {
	return ix.update(pod, tier, hashes, false)
}

func (ix *Index) update(pod index.PodID, tier index.Tier, hashes []uint64, add bool) error {
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
	op := "0"
	if add {
		op = "1"
	}
	blob := ix.encodeHashes(hashes)
	defer ix.blobs.Put(blob)
	ctx, cancel := ix.ctx()
	defer cancel()
	err = updateScript.Run(ctx, ix.rdb, []string{ix.registry},
		ix.prefix, name, 1<<tier, op, ix.now().UnixMilli(), ix.ttlMillis(), *blob).Err()
	if err != nil && !errors.Is(err, goredis.Nil) {
		return fmt.Errorf("redisindex: updating %d blocks of pod %q: %w", len(hashes), name, err)
	}
	return nil
}

// ClearPod implements index.Store. It has no error to return: a failure
// counts in Stats.ClearErrors, and the pod's holdings then expire.
func (ix *Index) ClearPod(pod index.PodID) {
	if ix.clear(pod, allTiers) != nil {
		ix.clearErrors.Add(1)
	}
}

// ClearPodTier implements index.Store.
func (ix *Index) ClearPodTier(pod index.PodID, tier index.Tier) error {
	if tier >= index.NumTiers {
		return fmt.Errorf("redisindex: %w: %d", index.ErrBadTier, tier)
	}
	return ix.clear(pod, 1<<tier)
}

// clear clears bits from every holding of pod, ClearChunk blocks per
// script call, so other clients' commands interleave.
func (ix *Index) clear(pod index.PodID, bits int) error {
	name, err := ix.podName(pod)
	if err != nil {
		return err
	}
	cursor := "0"
	for {
		ctx, cancel := ix.ctx()
		cursor, err = clearScript.Run(ctx, ix.rdb, []string{ix.registry},
			ix.prefix, name, bits, cursor, ClearChunk).Text()
		cancel()
		if err != nil {
			return fmt.Errorf("redisindex: clearing pod %q: %w", name, err)
		}
		if cursor == "0" {
			return nil
		}
	}
}

// Reap deletes every holding that no Add has refreshed for the TTL, of
// every pod in the registry, and returns how many it deleted. Writes call
// it on their own at most every TTL/16; it is exported for operators and
// tests. With expiry off it does nothing.
func (ix *Index) Reap() (int, error) {
	if ix.ttl < 0 {
		return 0, nil
	}
	ctx, cancel := ix.ctx()
	names, err := ix.rdb.ZRange(ctx, ix.registry, 0, -1).Result()
	cancel()
	if err != nil {
		return 0, fmt.Errorf("redisindex: reading the pod registry: %w", err)
	}
	// Pipelined calls cannot fall back from EVALSHA to EVAL one by one.
	ctx, cancel = ix.ctx()
	err = reapScript.Load(ctx, ix.rdb).Err()
	cancel()
	if err != nil {
		return 0, fmt.Errorf("redisindex: loading the reap script: %w", err)
	}
	cutoff := ix.now().Add(-ix.ttl).UnixMilli()
	total := 0
	for len(names) > 0 {
		n, more, err := ix.reapRound(names, cutoff)
		total += n
		ix.reaped.Add(uint64(n))
		if err != nil {
			return total, err
		}
		names = more
	}
	return total, nil
}

// reapRound runs one reap script call per pod in one pipeline and returns
// the holdings deleted and the pods that may have more.
func (ix *Index) reapRound(names []string, cutoff int64) (int, []string, error) {
	ctx, cancel := ix.ctx()
	defer cancel()
	pipe := ix.rdb.Pipeline()
	cmds := make([]*goredis.Cmd, len(names))
	for i, name := range names {
		cmds[i] = reapScript.EvalSha(ctx, pipe, []string{ix.registry}, ix.prefix, name, cutoff, ClearChunk)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, nil, fmt.Errorf("redisindex: reaping: %w", err)
	}
	total := 0
	var more []string
	for i, cmd := range cmds {
		n, _ := cmd.Int()
		total += n
		if n == ClearChunk {
			more = append(more, names[i])
		}
	}
	return total, more, nil
}

// maybeReap runs Reap if no write of this Index started one for TTL/16.
func (ix *Index) maybeReap() {
	if ix.ttl < 0 {
		return
	}
	now := ix.now().UnixMilli()
	last := ix.lastReap.Load()
	every := max(ix.ttl/16, time.Second).Milliseconds()
	if now-last < every || !ix.lastReap.CompareAndSwap(last, now) {
		return
	}
	if _, err := ix.Reap(); err != nil {
		ix.reapErrors.Add(1)
	}
}
