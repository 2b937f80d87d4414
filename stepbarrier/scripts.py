"""The Lua code that keeps a job's state consistent.

Each piece runs atomically in Redis, so a store and its announcement can never
be seen apart. All keys share the job's hash tag and are passed in ``KEYS``.
Numbers are formatted with ``%.0f`` because Lua numbers are doubles: steps and
generations stay below 2**53, where doubles are exact.

``BODIES`` holds each piece once. ``stepbarrier.redis_code`` registers them as
the functions of a versioned Redis Functions library (the default: no role
needs to run code of its own), or runs them as ``EVAL`` scripts when a server
has no Functions; the constants below are those scripts.
"""

from __future__ import annotations

from stepbarrier.barrier_scripts import BARRIER_ARRIVE_BODY

HELPERS = """
local function whole(text)
  -- One definition of a stored number, the same as Python's protocol.parse_int:
  -- 1 to 16 ASCII digits (no sign, space, exponent or hex), at most 2^53.
  if type(text) ~= 'string' or #text > 16 or not string.match(text, '^%d+$') then return nil end
  local n = tonumber(text)
  if n and n <= 9007199254740992 then return n end
  return nil
end
local function publish_command(name)
  -- announcements go out plain, or sharded on a Redis Cluster; nothing else
  if name == 'SPUBLISH' then return 'SPUBLISH' end
  return 'PUBLISH'
end
local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
"""

_BEGIN_GENERATION = """
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

ACCEPTED = 1
"""PUBLISH_STEP reply status: the write was applied."""
SUPERSEDED = 0
"""PUBLISH_STEP reply status: a newer chief generation owns the job."""
WAS_RESET = 2
"""PUBLISH_STEP reply status: the job was reset after this chief began."""
NOTHING_TO_JOIN = 3
"""PUBLISH_STEP reply status (contributor): no live state of this run to add to."""
REJOIN = 4
"""PUBLISH_STEP reply status (contributor): the state has another generation now."""

_PUBLISH_STEP = """
-- KEYS[1] state hash, KEYS[2] targets zset, KEYS[3] reset marker
-- ARGV[1] generation, ARGV[2] step, ARGV[3] done (0/1), ARGV[4] key TTL (s),
-- ARGV[5] channel, ARGV[6] chief description, ARGV[7] max targets to return,
-- ARGV[8] (unused: the waiters' registry prefix, no longer touched), ARGV[9] run id
-- ('' for none), ARGV[10] ms since the training loop last handed over the step,
-- ARGV[11] the writer's heartbeat period (ms), ARGV[12] how long (ms) a handed
-- step vouches for itself, ARGV[13] TTL (s) of a finished job's keys,
-- ARGV[14] the writer's first generation (a reset after it refuses the writer),
-- ARGV[15] 'chief' or 'contributor' (a training worker adding its step),
-- ARGV[16] 'PUBLISH', or 'SPUBLISH' on a Redis Cluster (sharded: the channel
-- lives in the job's slot, so an announcement costs one shard).
-- A chief stores the step if it is greater (same generation) or replaces it
-- (newer generation); a contributor only raises the step of the generation it
-- joined. Either refreshes the heartbeat and TTLs, announces a change, and
-- returns what the writer needs for its next write:
--   {status, stored step, stored generation, repaired (0/1), pending targets...}
-- status: 1 accepted, 0 superseded, 2 reset after the writer began,
--         3 nothing to join (contributor), 4 rejoin (contributor: new generation)
local generation = tonumber(ARGV[1])
local step = tonumber(ARGV[2])
local run_id = ARGV[9]
local contributor = ARGV[15] == 'contributor'
if #run_id > 64 or not string.match(run_id, '^[%w._-]*$') then
  return redis.error_reply('ERR stepbarrier: malformed run id')
end
local now = now_ms()
local repaired = 0
local reset_ms = nil
if redis.call('TYPE', KEYS[3]).ok == 'string' then reset_ms = whole(redis.call('GET', KEYS[3])) end
local epoch = tonumber(ARGV[14])
if reset_ms and epoch > 0 and reset_ms * 1000 >= epoch then
  return {2, '-1', '0', 0}
end
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
local stored_run = redis.call('HGET', KEYS[1], 'run_id') or ''
local was_done = redis.call('HGET', KEYS[1], 'done') == '1'
if stored_gen == nil or stored_step == nil then
  -- nothing trustworthy is stored (no state, or malformed)
  if redis.call('EXISTS', KEYS[1]) == 1 then repaired = 1 end
  stored_gen = 0
  stored_step = nil
end
local changed = false
if contributor then
  if stored_step == nil or was_done or stored_run ~= run_id then
    return {3, '-1', '0', repaired}
  end
  if stored_gen ~= generation then
    return {4, string.format('%.0f', stored_step), string.format('%.0f', stored_gen), repaired}
  end
  if step > stored_step then
    redis.call('HSET', KEYS[1], 'step', string.format('%.0f', step))
    stored_step = step
    changed = true
  end
else
  if stored_gen > generation then
    return {0, string.format('%.0f', stored_step or -1),
            string.format('%.0f', stored_gen), repaired}
  end
  if stored_gen < generation or stored_step == nil then
    redis.call('DEL', KEYS[1])
    redis.call('HSET', KEYS[1], 'generation', string.format('%.0f', generation),
               'step', string.format('%.0f', step), 'done', '0', 'run_id', run_id)
    stored_step = step
    was_done = false
    changed = true
  elseif step > stored_step then
    redis.call('HSET', KEYS[1], 'step', string.format('%.0f', step))
    stored_step = step
    changed = true
  end
  if ARGV[3] == '1' and not was_done then
    redis.call('HSET', KEYS[1], 'done', '1', 'done_ms', string.format('%.0f', now))
    was_done = true
    changed = true
  end
  redis.call('HSET', KEYS[1], 'chief', ARGV[6], 'heartbeat_period_ms', ARGV[11],
             'confirm_ms', ARGV[12])
end
-- the step was last handed over by the training loop this long ago: a step that
-- no loop has confirmed lately (a chief recovering its session) releases nobody
-- (the chief says when its loop last did; a contributor can only make it later)
local published = now - tonumber(ARGV[10])
local stored_published = whole(redis.call('HGET', KEYS[1], 'published_ms'))
if not contributor or stored_published == nil or published > stored_published then
  redis.call('HSET', KEYS[1], 'published_ms', string.format('%.0f', published))
end
redis.call('HSET', KEYS[1], 'heartbeat_ms', string.format('%.0f', now))
-- a finished job's keys go soon, so that a rerun under the same name starts clean
local ttl = tonumber(ARGV[4])
if was_done and tonumber(ARGV[13]) < ttl then ttl = tonumber(ARGV[13]) end
redis.call('EXPIRE', KEYS[1], ttl)
local step_text = string.format('%.0f', stored_step)
local gen_text = string.format('%.0f', stored_gen > generation and stored_gen or generation)
if changed then
  -- waiters at or below the stored step are released by this announcement:
  -- they leave the index here, so that a released worker need not spend a
  -- round trip unregistering before it starts (its entry expires by itself;
  -- every key touched is declared, as a cluster and its proxies demand)
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', step_text)
  redis.call(publish_command(ARGV[16]), ARGV[5], string.format(
    '{"step":%s,"generation":%s,"done":%s,"run_id":"%s"}', step_text, gen_text,
    was_done and 'true' or 'false', run_id))
end
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('EXPIRE', KEYS[2], ttl) end
local result = {1, step_text, gen_text, repaired}
-- only whole steps in range guide the chief: a hostile +inf score is skipped
local pending = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. step_text, '9007199254740992',
                           'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[7]))
for i = 2, #pending, 2 do
  local target = whole(pending[i])
  if target then result[#result + 1] = pending[i] end
end
return result
"""

_RESET_JOB = """
-- KEYS[1] state, KEYS[2] targets, KEYS[3] registrations, KEYS[4] reset marker,
-- KEYS[5] barrier index, KEYS[6..] waiter registry keys and barrier hashes;
-- ARGV[1] channel, ARGV[2] marker TTL (s), ARGV[3] 'PUBLISH' or 'SPUBLISH' (see
-- PUBLISH_STEP), ARGV[4] barrier channel, ARGV[5] prefix of the barrier hashes
-- Deletes the job's keys, leaves a marker holding the Redis time (ms) of the
-- reset so that waiters who missed the announcement still abort, and announces it
-- on both channels. Returns the marker; or false, changing nothing, when the
-- index names a barrier whose hash KEYS lacks (one begun since the caller read
-- the index), so that the caller reads it again and no barrier outlives a reset.
if ARGV[5] and redis.call('TYPE', KEYS[5]).ok == 'zset' then
  local declared = {}
  for i = 6, #KEYS do declared[KEYS[i]] = true end
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', '+inf')) do
    if not declared[ARGV[5] .. member] then return false end
  end
end
for i = 5, #KEYS do redis.call('DEL', KEYS[i]) end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
local now = redis.call('TIME')
local now_ms = string.format('%.0f', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
redis.call('SET', KEYS[4], now_ms, 'EX', ARGV[2])
local notice = '{"reset":true,"time_ms":' .. now_ms .. '}'
redis.call(publish_command(ARGV[3]), ARGV[1], notice)
if ARGV[4] then redis.call(publish_command(ARGV[3]), ARGV[4], notice) end
return now_ms
"""

_WAITER_REGISTER = """
-- KEYS[1] this waiter's registry hash, KEYS[2] targets zset, KEYS[3] registrations list
-- ARGV[1] registry TTL (s), ARGV[2] key TTL (s), ARGV[3] waiter id, ARGV[4] target,
-- ARGV[5..] registry fields and values
-- (Re-)registers the waiter if its entry is gone (first call, expiry, or a Redis
-- restarted empty) or refreshes the entry's TTL, and puts its target back in the
-- targets zset (the job's index of waiters, which the chief relearns from even
-- if the zset was lost). Only what a waiter writes is declared: Redis's ACL
-- demands read AND write permission on every key that FCALL/EVAL declares.
local fresh_entry = redis.call('EXPIRE', KEYS[1], ARGV[1]) == 0
if fresh_entry then
  local entry = {}
  for i = 5, #ARGV do entry[#entry + 1] = ARGV[i] end
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], unpack(entry))
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
-- the targets and the list only guide the chief: a malformed one is skipped
if pcall(redis.call, 'ZADD', KEYS[2], ARGV[4], ARGV[3]) then
  redis.call('EXPIRE', KEYS[2], ARGV[2])
end
if fresh_entry and pcall(redis.call, 'RPUSH', KEYS[3], ARGV[4]) then
  redis.call('LTRIM', KEYS[3], -1000, -1)
  redis.call('EXPIRE', KEYS[3], ARGV[2])
end
return 1
"""

_WAITER_READ = """
-- KEYS[1] state hash, KEYS[2] reset marker (read only: FCALL_RO, no write permission needed)
-- Returns the Redis time, the reset marker and the state:
--   {now_ms, reset marker or false, state type, state field/value pairs...}
local result = {string.format('%.0f', now_ms())}
if redis.call('TYPE', KEYS[2]).ok == 'string' then
  result[2] = redis.call('GET', KEYS[2])
else
  result[2] = false
end
local kind = redis.call('TYPE', KEYS[1]).ok
result[3] = kind
if kind == 'hash' then
  local fields = redis.call('HGETALL', KEYS[1])
  for i = 1, #fields do result[#result + 1] = fields[i] end
end
return result
"""

_WAITER_LEAVE = """
-- KEYS[1] this waiter's registry hash, KEYS[2] targets zset; ARGV[1] waiter id
redis.call('DEL', KEYS[1])
if redis.call('TYPE', KEYS[2]).ok == 'zset' then redis.call('ZREM', KEYS[2], ARGV[1]) end
return 1
"""

_MAY_WRITE = """
-- KEYS: the keys a caller means to write. Does nothing: Redis's ACL checks the
-- declared keys before running it, so it tells whether this user may write them.
return 1
"""

BODIES: dict[str, tuple[str, bool]] = {
    "begin_generation": (_BEGIN_GENERATION, False),
    "publish_step": (_PUBLISH_STEP, False),
    "reset_job": (_RESET_JOB, False),
    "waiter_register": (_WAITER_REGISTER, False),
    "waiter_read": (_WAITER_READ, True),
    "waiter_leave": (_WAITER_LEAVE, False),
    "may_write": (_MAY_WRITE, False),
    "barrier_arrive": (BARRIER_ARRIVE_BODY, False),
}
"""Each piece of code by name: its Lua body and whether it only reads."""

BEGIN_GENERATION = HELPERS + _BEGIN_GENERATION
PUBLISH_STEP = HELPERS + _PUBLISH_STEP
RESET_JOB = HELPERS + _RESET_JOB
WAITER_REGISTER = HELPERS + _WAITER_REGISTER
WAITER_READ = HELPERS + _WAITER_READ
WAITER_LEAVE = HELPERS + _WAITER_LEAVE
BARRIER_ARRIVE = HELPERS + BARRIER_ARRIVE_BODY
