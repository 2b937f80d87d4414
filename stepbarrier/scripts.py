"""The Lua scripts that keep a job's state consistent.

Each script runs atomically in Redis, so a store and its announcement can never
be seen apart. All keys share the job's hash tag and are passed in ``KEYS``.
Numbers are formatted with ``%.0f`` because Lua numbers are doubles: steps and
generations stay below 2**53, where doubles are exact.
"""

from __future__ import annotations

_WHOLE = """
local function whole(text)
  -- a stored number is trusted only if it is a whole number in [0, 2^53]
  local n = tonumber(text)
  if n and n >= 0 and n <= 9007199254740992 and n == math.floor(n) then return n end
  return nil
end
"""

BEGIN_GENERATION = (
    _WHOLE
    + """
-- KEYS[1] state hash
-- Returns a generation number above every one this job has used: the Redis
-- clock in microseconds, or the stored generation + 1 if that is higher (the
-- clock went back, or two chiefs began in the same microsecond).
local now = redis.call('TIME')
local generation = tonumber(now[1]) * 1000000 + tonumber(now[2])
if redis.call('TYPE', KEYS[1]).ok == 'hash' then
  local stored = whole(redis.call('HGET', KEYS[1], 'generation'))
  if stored and stored >= generation then generation = stored + 1 end
end
return string.format('%.0f', generation)
"""
)

PUBLISH_STEP = (
    _WHOLE
    + """
-- KEYS[1] state hash, KEYS[2] targets zset, KEYS[3] reset marker
-- ARGV[1] generation, ARGV[2] step, ARGV[3] done (0/1), ARGV[4] key TTL (s),
-- ARGV[5] channel, ARGV[6] chief description, ARGV[7] max targets to return,
-- ARGV[8] prefix of the waiters' registry keys (same hash tag)
-- Stores the step if it is greater (same generation) or replaces it (newer
-- generation), refreshes the heartbeat and TTLs, announces a change on the
-- channel, and returns what the chief needs to decide its next write:
--   {accepted (1) or stale generation (0), stored step, stored generation,
--    repaired (1 if malformed state was replaced), pending targets...}
local generation = tonumber(ARGV[1])
local step = tonumber(ARGV[2])
local repaired = 0
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'hash' and kind ~= 'none' then
  redis.call('DEL', KEYS[1]); repaired = 1
end
kind = redis.call('TYPE', KEYS[2]).ok
if kind ~= 'zset' and kind ~= 'none' then
  redis.call('DEL', KEYS[2]); repaired = 1
end
local stored_gen = whole(redis.call('HGET', KEYS[1], 'generation'))
local stored_step = whole(redis.call('HGET', KEYS[1], 'step'))
if stored_gen == nil or stored_step == nil then
  -- nothing trustworthy is stored (no state, or malformed): this chief's step replaces it
  if redis.call('EXISTS', KEYS[1]) == 1 then repaired = 1 end
  stored_gen = 0
  stored_step = nil
end
if stored_gen > generation then
  return {0, string.format('%.0f', stored_step or -1), string.format('%.0f', stored_gen), repaired}
end
local changed = false
if stored_gen < generation or stored_step == nil then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'generation', string.format('%.0f', generation),
             'step', string.format('%.0f', step), 'done', '0')
  redis.call('DEL', KEYS[3])
  stored_step = step
  changed = true
elseif step > stored_step then
  redis.call('HSET', KEYS[1], 'step', string.format('%.0f', step))
  stored_step = step
  changed = true
end
if ARGV[3] == '1' and redis.call('HGET', KEYS[1], 'done') ~= '1' then
  redis.call('HSET', KEYS[1], 'done', '1')
  changed = true
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('HSET', KEYS[1], 'heartbeat_ms', string.format('%.0f', now_ms), 'chief', ARGV[6])
redis.call('EXPIRE', KEYS[1], ARGV[4])
local step_text = string.format('%.0f', stored_step)
if changed then
  -- waiters at or below the stored step are released by this announcement:
  -- their registry entries go here, so that a released worker need not
  -- spend a round trip unregistering before it starts
  local released = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', step_text)
  for i = 1, #released do redis.call('DEL', ARGV[8] .. released[i]) end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', step_text)
  local done = redis.call('HGET', KEYS[1], 'done') == '1'
  redis.call('PUBLISH', ARGV[5], string.format(
    '{"step":%s,"generation":%s,"done":%s}', step_text,
    string.format('%.0f', generation), done and 'true' or 'false'))
end
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('EXPIRE', KEYS[2], ARGV[4]) end
local result = {1, step_text, string.format('%.0f', generation), repaired}
local pending = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. step_text, '+inf',
                           'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[7]))
for i = 2, #pending, 2 do result[#result + 1] = pending[i] end
return result
"""
)

RESET_JOB = """
-- KEYS[1] state, KEYS[2] targets, KEYS[3] registrations, KEYS[4] reset marker,
-- KEYS[5..] waiter registry keys; ARGV[1] channel, ARGV[2] marker TTL (s)
-- Deletes the job's keys, leaves a marker holding the Redis time (ms) of the
-- reset so that waiters who missed the announcement still abort, and announces it.
for i = 5, #KEYS do redis.call('DEL', KEYS[i]) end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
local now = redis.call('TIME')
local now_ms = string.format('%.0f', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
redis.call('SET', KEYS[4], now_ms, 'EX', ARGV[2])
redis.call('PUBLISH', ARGV[1], '{"reset":true,"time_ms":' .. now_ms .. '}')
return now_ms
"""

WAITER_SYNC = """
-- KEYS[1] this waiter's registry hash, KEYS[2] targets zset, KEYS[3] registrations list
-- ARGV[1] state key, ARGV[2] reset marker key (same hash tag), ARGV[3] registry
-- TTL (s), ARGV[4] key TTL (s), ARGV[5] waiter id, ARGV[6] target,
-- ARGV[7..] registry fields and values
-- KEYS holds only what a waiter writes: Redis's ACL demands read AND write
-- permission on every key an EVALSHA declares, so the two keys it only reads
-- travel in ARGV, and the ACL's worker user can read, never write, them.
-- A waiter's one command per fallback interval: (re-)registers it if its entry
-- is gone (first call, expiry, or a Redis restarted empty) or refreshes the
-- entry's TTL, then returns the Redis time, the reset marker and the state:
--   {now_ms, reset marker or false, state type, state field/value pairs...}
if redis.call('EXPIRE', KEYS[1], ARGV[3]) == 0 then
  local entry = {}
  for i = 7, #ARGV do entry[#entry + 1] = ARGV[i] end
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], unpack(entry))
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  -- the targets and the list only guide the chief: a malformed one is skipped
  if pcall(redis.call, 'ZADD', KEYS[2], ARGV[6], ARGV[5]) then
    redis.call('EXPIRE', KEYS[2], ARGV[4])
  end
  if pcall(redis.call, 'RPUSH', KEYS[3], ARGV[6]) then
    redis.call('LTRIM', KEYS[3], -1000, -1)
    redis.call('EXPIRE', KEYS[3], ARGV[4])
  end
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local result = {string.format('%.0f', now_ms)}
if redis.call('TYPE', ARGV[2]).ok == 'string' then
  result[2] = redis.call('GET', ARGV[2])
else
  result[2] = false
end
local kind = redis.call('TYPE', ARGV[1]).ok
result[3] = kind
if kind == 'hash' then
  local fields = redis.call('HGETALL', ARGV[1])
  for i = 1, #fields do result[#result + 1] = fields[i] end
end
return result
"""

WAITER_LEAVE = """
-- KEYS[1] this waiter's registry hash, KEYS[2] targets zset; ARGV[1] waiter id
redis.call('DEL', KEYS[1])
if redis.call('TYPE', KEYS[2]).ok == 'zset' then redis.call('ZREM', KEYS[2], ARGV[1]) end
return 1
"""
