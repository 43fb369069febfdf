package controller

import goredis "github.com/redis/go-redis/v9"

// The shared registry's scripts. Each changes the registry in one atomic
// step, so replicas acting at once never both drop, or half-register, a
// daemon. Times are Redis's own clock (TIME), the one clock every
// replica shares, in Unix milliseconds (below 2^53: exact in Lua's
// doubles). KEYS are named so that a call is routed to the registry.

// nowMS is shared Lua: Redis's clock in Unix milliseconds.
const nowMS = `
local function nowms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
`

// registerScript records a registration with a new session, unless the
// instance's previous entries are still being cleared ({"busy"}). It
// returns {"ok", the previous registration's JSON or ""}.
// KEYS: beats, clearing, the instance's hash. ARGV: instance, registration JSON, session, channel.
var registerScript = goredis.NewScript(nowMS + `
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return {'busy', ''} end
local now = nowms()
local old = redis.call('HGET', KEYS[3], 'reg') or ''
redis.call('HSET', KEYS[3], 'reg', ARGV[2], 'session', ARGV[3], 'registered', string.format('%d', now))
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('PUBLISH', ARGV[4], ARGV[1])
return {'ok', old}
`)

// beatScript records a heartbeat of the instance's current session and
// returns 1, or 0 for a session the registry does not know.
// KEYS: beats, the instance's hash. ARGV: instance, session.
var beatScript = goredis.NewScript(nowMS + `
if ARGV[2] == '' or redis.call('HGET', KEYS[2], 'session') ~= ARGV[2] then return 0 end
redis.call('ZADD', KEYS[1], 'XX', nowms(), ARGV[1])
return 1
`)

// leaveScript deregisters the instance's current session: the record
// goes, and the instance waits in the clearing set, leased to the caller
// for lease ms, until its entries are cleared. Returns 1, or 0 for an
// unknown session.
// KEYS: beats, clearing, the instance's hash. ARGV: instance, session, lease ms, channel.
var leaveScript = goredis.NewScript(nowMS + `
if ARGV[2] == '' or redis.call('HGET', KEYS[3], 'session') ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[3])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], nowms() + tonumber(ARGV[3]), ARGV[1])
redis.call('PUBLISH', ARGV[4], ARGV[1])
return 1
`)

// reapScript drops the instances whose last beat is older than window
// ms, moving each to the clearing set leased to the caller, and takes
// over the clears whose lease ran out (their replica died mid-clear). It
// returns the instances the caller must now clear. At most limit of each.
// KEYS: beats, clearing. ARGV: hash key prefix, window ms, lease ms, channel, limit.
var reapScript = goredis.NewScript(nowMS + `
local now, lease = nowms(), tonumber(ARGV[3])
local out = {}
local stuck = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, ARGV[5])
for _, inst in ipairs(stuck) do
  redis.call('ZADD', KEYS[2], now + lease, inst)
  table.insert(out, inst)
end
local late = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]), 'LIMIT', 0, ARGV[5])
for _, inst in ipairs(late) do
  redis.call('DEL', ARGV[1] .. inst)
  redis.call('ZREM', KEYS[1], inst)
  redis.call('ZADD', KEYS[2], now + lease, inst)
  redis.call('PUBLISH', ARGV[4], inst)
  table.insert(out, inst)
end
return out
`)
