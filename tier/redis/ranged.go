package redis

import (
	"context"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/chunk"
	"kvtier/tier"
	"kvtier/tier/remote"
)

var _ remote.RangeGetter = (*Tier)(nil)

// GetRange implements remote.RangeGetter with one GETRANGE, read from the
// socket straight into dst. It returns how many bytes the value has from
// off, up to len(dst): 0 for a missing key (GETRANGE answers an empty
// string for those). Layerwise loads read a chunk's layers this way.
func (t *Tier) GetRange(ctx context.Context, key chunk.Key, off int, dst []byte) (int, error) {
	if t.closed.Load() {
		return 0, fmt.Errorf("redis: get range %v: %w", key, tier.ErrClosed)
	}
	if len(dst) == 0 {
		return 0, nil
	}
	ctx, cancel := remote.BoundCall(ctx, t.timeout, t.bandwidth, len(dst))
	defer cancel()
	cmd := goredis.NewZeroCopyStringCmd(ctx, dst, "getrange", t.keyName(key), off, off+len(dst)-1)
	_ = t.client.Process(ctx, cmd)
	n, err := cmd.Result()
	if err != nil {
		return 0, t.getError(key, len(dst), err)
	}
	t.stats.bytesRead.Add(uint64(n))
	return n, nil
}
