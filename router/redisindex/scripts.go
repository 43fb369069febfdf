package redisindex

import goredis "github.com/redis/go-redis/v9"

// The scripts share a calling convention: KEYS[1] is the pod registry,
// named so that Redis Cluster routes the call to the index's slot;
// ARGV[1] is the key prefix; a batch of block hashes is one argument of
// 8 bytes per hash, big-endian, turned into hex key names here. Tier
// bitmasks are at most 4 bits, and Unix milliseconds are below 2^53, so
// Lua's doubles hold both exactly.

// hexOf is shared Lua: the 16 hex digits of the 8-byte hash at blob[i].
const hexOf = `
local function hexof(blob, i)
  return string.format('%02x%02x%02x%02x%02x%02x%02x%02x', string.byte(blob, i, i + 7))
end
`

// updateScript ORs bits into (Add) or clears them from (Remove) pod's mask
// of each block, keeping the pod's sorted set in step: an Add stamps the
// holding with now and pushes the block's expiry out; a mask reaching 0
// drops the holding. Remove does not refresh.
// ARGV: prefix, pod, bits, "1" add / "0" remove, now ms, ttl ms (0: none), hashes.
var updateScript = goredis.NewScript(hexOf + `
local prefix, pod, bits, add = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4] == '1'
local now, ttl, blob = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local podkey = prefix .. 'p:' .. pod
for i = 1, #blob - 7, 8 do
  local h = hexof(blob, i)
  local bkey = prefix .. 'b:' .. h
  local old = tonumber(redis.call('HGET', bkey, pod) or '0')
  local mask
  if add then mask = bit.bor(old, bits) else mask = bit.band(old, bit.bnot(bits)) end
  if mask ~= 0 then
    if mask ~= old then redis.call('HSET', bkey, pod, mask) end
    if add then
      redis.call('ZADD', podkey, now, h)
      if ttl > 0 then redis.call('PEXPIRE', bkey, ttl) end
    end
  elseif old ~= 0 then
    redis.call('HDEL', bkey, pod)
    redis.call('ZREM', podkey, h)
  end
end
if add then
  redis.call('ZADD', KEYS[1], now, pod)
  if ttl > 0 then
    redis.call('PEXPIRE', podkey, 2 * ttl)
    redis.call('PEXPIRE', KEYS[1], 2 * ttl)
  end
end
return 0
`)

// clearScript clears bits from pod's mask of up to count of its blocks,
// continuing a ZSCAN of the pod's set at cursor, and returns the next
// cursor ("0": done). A pod left with no holdings leaves the registry.
// ARGV: prefix, pod, bits, cursor, count.
var clearScript = goredis.NewScript(`
local prefix, pod, bits, cursor, count = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local podkey = prefix .. 'p:' .. pod
local scan = redis.call('ZSCAN', podkey, cursor, 'COUNT', count)
local found = scan[2]
for i = 1, #found, 2 do
  local h = found[i]
  local bkey = prefix .. 'b:' .. h
  local old = tonumber(redis.call('HGET', bkey, pod) or '0')
  local mask = bit.band(old, bit.bnot(bits))
  if mask == 0 then
    redis.call('HDEL', bkey, pod)
    redis.call('ZREM', podkey, h)
  elseif mask ~= old then
    redis.call('HSET', bkey, pod, mask)
  end
end
if scan[1] == '0' and redis.call('EXISTS', podkey) == 0 then
  redis.call('ZREM', KEYS[1], pod)
end
return scan[1]
`)

// reapScript deletes up to count of pod's holdings last added at or before
// cutoff and returns how many it deleted. A pod left with no holdings
// leaves the registry.
// ARGV: prefix, pod, cutoff ms, count.
var reapScript = goredis.NewScript(`
local prefix, pod, cutoff, count = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local podkey = prefix .. 'p:' .. pod
local stale = redis.call('ZRANGEBYSCORE', podkey, '-inf', cutoff, 'LIMIT', 0, count)
for _, h in ipairs(stale) do
  redis.call('HDEL', prefix .. 'b:' .. h, pod)
  redis.call('ZREM', podkey, h)
end
if redis.call('EXISTS', podkey) == 0 then
  redis.call('ZREM', KEYS[1], pod)
end
return #stale
`)
