package redis

import (
	"context"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/chunk"
	"kvtier/tier/remote"
)

var _ remote.DamageRemover = (*Tier)(nil)

// removeDamagedScript deletes KEYS[1] only while its value is what a
// reader found damaged: ARGV[1] its length (-1: not known), ARGV[2] its
// first bytes, ARGV[4] more bytes at offset ARGV[3] (empty: none). It
// returns 1 deleted, 0 the value is another (replaced, or gone).
var removeDamagedScript = goredis.NewScript(`
local size = tonumber(ARGV[1])
if size >= 0 and redis.call('STRLEN', KEYS[1]) ~= size then
  return 0
end
if redis.call('GETRANGE', KEYS[1], 0, #ARGV[2] - 1) ~= ARGV[2] then
  return 0
end
if #ARGV[4] > 0 then
  local off = tonumber(ARGV[3])
  if redis.call('GETRANGE', KEYS[1], off, off + #ARGV[4] - 1) ~= ARGV[4] then
    return 0
  end
end
return redis.call('DEL', KEYS[1])
`)

// RemoveDamaged implements remote.DamageRemover with one script that
// compares the value with the damaged bytes and deletes it only if they
// match, so that a good object stored since the damaged read (after
// another reader removed the damaged one) stays. A Redis that refuses
// scripts keeps the damaged object; the breaker is what stops its reads.
func (t *Tier) RemoveDamaged(key chunk.Key, d remote.Damage) remote.Removal {
	if t.closed.Load() || len(d.Head) == 0 {
		return remote.DamageKept
	}
	ctx, cancel := remote.BoundCall(context.Background(), t.timeout, t.bandwidth, len(d.Head)+len(d.Part))
	defer cancel()
	n, err := removeDamagedScript.Run(ctx, t.client, []string{t.keyName(key)},
		d.Size, d.Head, d.Off, d.Part).Int()
	if err != nil {
		t.logError("remove damaged", key, err)
		return remote.DamageKept
	}
	if n == 0 {
		return remote.DamageGone
	}
	t.known.forget(key)
	t.stats.removes.Add(1)
	return remote.DamageRemoved
}
