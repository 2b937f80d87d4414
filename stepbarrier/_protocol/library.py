"""The Lua code that keeps a job's state consistent.

Each piece runs atomically in Redis, so a store and its announcement can never
be seen apart. All keys share the job's hash tag and are passed in ``KEYS``.
Numbers are formatted with ``%.0f`` because Lua numbers are doubles: steps and
generations stay below 2**53, where doubles are exact.

``BODIES`` holds each piece once. ``stepbarrier._redis.functions`` registers them as
the functions of a versioned Redis Functions library (the default: no role
needs to run code of its own), or runs them as ``EVAL`` scripts when a server
has no Functions; the constants below are those scripts.

Bounded work (issue 23). Redis checks what a function runs against the caller's
ACL, so whoever may write a job's keys through the library may write them
directly too, with any size, and may call any function on any key it may
touch. So no function does work proportional to what a role can write: it
checks a key's type and size first (``TYPE``, ``HLEN``, ``HSTRLEN``,
``STRLEN``, ``LLEN``, ``ZCARD``, ``ZCOUNT``: O(1) or O(log n)), reads only the
fields it needs (``HMGET`` of known names, never ``HGETALL``), reads and
removes sorted set members by at most a fixed number per call, deletes with
``UNLINK`` (the memory of a large key is freed off the main thread), and
refuses, or treats as malformed, what is larger than the limits below.
"""

from __future__ import annotations

from stepbarrier._protocol.barrier_library import BARRIER_ARRIVE_BODY, MAX_BARRIER_INDEX
from stepbarrier._protocol.barrier_record import MAX_PARTIES
from stepbarrier._protocol.wire import MAX_STEP

MAX_FIELDS = 32
"""Most fields of a state hash, a waiter's entry or the barrier epoch (a barrier:
this plus its parties); a larger hash is ``oversized``: refused, never read."""
MAX_VALUE = 256
"""Longest value of a known field that the code reads (a chief's ``host:pid`` is
at most 200 characters); a longer one makes its hash ``oversized``."""
MAX_TASK_VALUE = 16
"""Longest arrival time of a barrier's task field (a whole number)."""
MAX_MARKER = 64
"""Longest reset marker read; a longer one reads as ``oversized`` (a token that
equals no writer's)."""
MAX_TARGETS_READ = 1000
"""Most pending targets one ``publish_step`` returns, whatever the caller asks."""
MAX_REMOVED = 1000
"""Most released targets one ``publish_step`` removes from the index (the rest go
at the next writes)."""
MAX_REGISTRATIONS = 1000
"""Most entries the registrations list keeps; one of twice that or more is dropped
whole before the next push (it only hurries the chief)."""
MAX_RESET_KEYS = 2000
"""Most waiter entries and barrier hashes one ``reset_job`` call deletes (besides
its six fixed keys): ``stepbarrier reset`` passes at most 1000 of each."""
STATE_FIELDS = (
    "generation",
    "step",
    "beat",
    "run_id",
    "vouch",
    "fence",
    "done",
    "pinned",
    "reset_seen",
    "chief",
    "heartbeat_ms",
    "done_ms",
    "heartbeat_period_ms",
)
"""The fields of the state hash (docs/protocol.md#keys): all that is ever read of it."""
BARRIER_FIELDS = ("parties", "arrived", "created_ms", "run_id", "epoch", "last_ms", "completed_ms")
"""A barrier hash's own fields; the others are ``t<task id>``, one per arrival."""
EPOCH_FIELDS = ("token", "by")
"""The fields of the job's barrier epoch hash."""


def _lua_names(names: tuple[str, ...]) -> str:
    return "{" + ", ".join(f"'{name}'" for name in names) + "}"


HELPERS = (
    f"""
local MAX_STEP = {MAX_STEP}
local MAX_FIELDS, MAX_VALUE, MAX_TASK_VALUE = {MAX_FIELDS}, {MAX_VALUE}, {MAX_TASK_VALUE}
local MAX_MARKER, MAX_PARTIES, MAX_BARRIER_INDEX = {MAX_MARKER}, {MAX_PARTIES}, {MAX_BARRIER_INDEX}
local MAX_TARGETS_READ, MAX_REMOVED = {MAX_TARGETS_READ}, {MAX_REMOVED}
local MAX_REGISTRATIONS, MAX_RESET_KEYS = {MAX_REGISTRATIONS}, {MAX_RESET_KEYS}
local STATE_FIELDS = {_lua_names(STATE_FIELDS)}
local BARRIER_FIELDS = {_lua_names(BARRIER_FIELDS)}
local EPOCH_FIELDS = {_lua_names(EPOCH_FIELDS)}
"""
    + """
local function whole(text)
  -- One definition of a stored number, the same as Python's protocol.parse_int:
  -- 1 to 16 ASCII digits (no sign, space, exponent or hex), at most 2^53.
  if type(text) ~= 'string' or #text > 16 or not string.match(text, '^%d+$') then return nil end
  local n = tonumber(text)
  if n and n <= MAX_STEP then return n end
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
local function short_string(key, limit)
  -- a string key's value if it has at most `limit` bytes; nil: no string there;
  -- false: a longer one (never read: STRLEN is O(1), GET copies)
  if redis.call('TYPE', key).ok ~= 'string' then return nil end
  if redis.call('STRLEN', key) > limit then return false end
  return redis.call('GET', key)
end
local function field_values(key, names, limit)
  -- HMGET of `names` (false: absent), or nil if one of them is longer than `limit`
  -- bytes: O(#names), whatever else the hash holds
  for i = 1, #names do
    if redis.call('HSTRLEN', key, names[i]) > limit then return nil end
  end
  return redis.call('HMGET', key, unpack(names))
end
local function read_hash(key, names, max_fields)
  -- kind, fields (name -> value), length. kind: the key's type, or 'oversized'
  -- (more than max_fields fields, or a value of `names` over MAX_VALUE bytes):
  -- then nothing of it is read
  local kind = redis.call('TYPE', key).ok
  if kind ~= 'hash' then return kind, {}, 0 end
  local length = redis.call('HLEN', key)
  if length > max_fields then return 'oversized', {}, length end
  local values = field_values(key, names, MAX_VALUE)
  if values == nil then return 'oversized', {}, length end
  local fields = {}
  for i = 1, #names do
    if values[i] then fields[names[i]] = values[i] end
  end
  return 'hash', fields, length
end
local function barrier_parties(fields)
  local parties = whole(fields.parties)
  if parties and parties >= 1 and parties <= MAX_PARTIES then return parties end
  return nil
end
"""
)
_BEGIN_GENERATION = """
-- KEYS[1] state hash, KEYS[2] reset marker; ARGV[1] the caller's run id ('' for none)
-- Returns a generation number above every one this job's state shows (the
-- Redis clock in microseconds, or the stored generation (or fence) + 1 if that
-- is higher: the clock went back, or two chiefs began in the same microsecond),
-- and records it as the state's fence, so that an older generation's writes are
-- refused from the begin on (docs/protocol.md#generations),
-- and what the new chief must know before its first write:
--   {generation, reset marker ('' for none), stored run id, stored beat,
--    stored done (0/1), stored chief, stored generation ('0' for none)}
-- The reset marker is a token: the chief's writes carry it, and a write under
-- another marker is refused (docs/protocol.md#reset). A marker longer than
-- MAX_MARKER reads as 'oversized', and an oversized state (see read_hash) as
-- another type's key: no state, left alone (the next write replaces it).
local now = redis.call('TIME')
local generation = tonumber(now[1]) * 1000000 + tonumber(now[2])
local run, beat, done, chief, stored = '', '0', '0', '', nil
local kind, state = read_hash(KEYS[1], STATE_FIELDS, MAX_FIELDS)
if kind == 'hash' then
  stored = whole(state.generation)
  if stored and whole(state.step) then
    if stored >= generation then generation = stored + 1 end
    -- the new generation fences the older ones from now on, not only from its
    -- first write: a write of a generation below the fence is superseded
    local fence = whole(state.fence)
    if fence and fence >= generation then generation = fence + 1 end
    run = state.run_id or ''
    -- only its own run's state: another run's chief is watched, not fenced
    -- (docs/protocol.md#runs)
    if run == (ARGV[1] or '') then
      redis.call('HSET', KEYS[1], 'fence', string.format('%.0f', generation))
    end
    beat = state.beat or '0'
    done = state.done or '0'
    chief = state.chief or ''
  else
    stored = nil
  end
end
if stored == nil and (kind == 'none' or kind == 'hash') then
  -- no state: leave the fence alone, so that an older generation's first write
  -- (a chief that paused between its begin and it) is refused all the same
  local fence = whole(state.fence)
  if fence and fence >= generation then generation = fence + 1 end
  redis.call('HSET', KEYS[1], 'fence', string.format('%.0f', generation))
  redis.call('EXPIRE', KEYS[1], 86400)
end
local marker = short_string(KEYS[2], MAX_MARKER)
if marker == false then marker = 'oversized' elseif marker == nil then marker = '' end
return {string.format('%.0f', generation), marker, string.sub(run, 1, 64),
        string.sub(beat, 1, 16), string.sub(done, 1, 1), string.sub(chief, 1, 200),
        stored and string.format('%.0f', stored) or '0'}
"""

ACCEPTED = 1
"""PUBLISH_STEP reply status: the write was applied."""
SUPERSEDED = 0
"""PUBLISH_STEP reply status: a newer chief generation owns the job."""
WAS_RESET = 2
"""PUBLISH_STEP reply status: the job was reset after this chief began."""
NOTHING_TO_JOIN = 3
"""PUBLISH_STEP reply status (contributor): no live state of this run to add to."""
OTHER_GENERATION = 4
"""PUBLISH_STEP reply status (contributor): the state belongs to another generation now;
a contributor never joins another one (docs/protocol.md#contributors)."""

_PUBLISH_STEP = """
-- KEYS[1] state hash, KEYS[2] targets zset, KEYS[3] reset marker
-- ARGV[1] generation, ARGV[2] step, ARGV[3] done (0/1), ARGV[4] key TTL (s),
-- ARGV[5] channel, ARGV[6] writer description (host:pid), ARGV[7] max targets
-- to return, ARGV[8] run id ('' for none), ARGV[9] vouch (0/1: the writer
-- vouches for the step, judged on its own clock), ARGV[10] the writer's
-- heartbeat period (ms, for operators), ARGV[11] TTL (s) of a finished job's
-- keys, ARGV[12] the reset marker the writer began under ('' for none),
-- ARGV[13] 'chief', 'contributor' (a training worker raising its generation's
-- step) or 'operator' (stepbarrier publish: a pinned step), ARGV[14] 'PUBLISH',
-- or 'SPUBLISH' on a Redis Cluster (the channel lives in the job's slot),
-- ARGV[15] '1' for the first write of a generation just begun (by the writer's
-- clock), '0' otherwise.
-- The rules are docs/protocol.md's. A chief (or operator) stores the step if it
-- is greater (same generation) or replaces the state (newer generation, or
-- none stored); a contributor only raises the step of the generation it
-- joined. Every accepted write adds one to the generation's beat (waiters
-- judge liveness by the beat moving while they watch, never by clocks) and is
-- announced. Returns
--   {status, stored step, stored generation, repaired (0/1), created (0/1),
--    pending targets...}
-- status: 1 accepted, 0 superseded, 2 reset after the writer began,
--         3 nothing to join (contributor), 4 another generation (contributor).
-- created: no valid state was stored and this write, not the first of a
-- generation just begun, made it: the writer may be a zombie whose successor's
-- state Redis forgot, so it is on probation (its state does not vouch) until a
-- newer chief could have fenced it (docs/protocol.md#probation). A generation
-- just begun is the newest one: its first write needs no probation.
local generation = tonumber(ARGV[1])
local step = tonumber(ARGV[2])
local run_id = ARGV[8]
local mode = ARGV[13]
local contributor = mode == 'contributor'
if #run_id > 64 or not string.match(run_id, '^[%w._-]*$') then
  return redis.error_reply('ERR stepbarrier: malformed run id')
end
local now = now_ms()
local repaired = 0
if not contributor then
  -- the marker is a token: any marker but the one this writer began under
  -- means a reset came after it began (equality only: no clock is compared);
  -- an oversized one equals no writer's ('oversized' is what a begin read)
  local marker = short_string(KEYS[3], MAX_MARKER)
  if marker == false or (marker ~= nil and marker ~= ARGV[12]) then return {2, '-1', '0', 0, 0} end
end
-- only the state's own fields are read, and only from a hash of at most
-- MAX_FIELDS short fields: anything else is malformed, and replaced
local kind, state = read_hash(KEYS[1], STATE_FIELDS, MAX_FIELDS)
if kind ~= 'hash' and kind ~= 'none' then
  redis.call('UNLINK', KEYS[1]); repaired = 1
end
kind = redis.call('TYPE', KEYS[2]).ok
if kind ~= 'zset' and kind ~= 'none' then
  redis.call('UNLINK', KEYS[2]); repaired = 1
end
local stored_gen = whole(state.generation)
local stored_step = whole(state.step)
local fence = whole(state.fence)
local stored_run = state.run_id or ''
local beat = whole(state.beat) or 0
local was_done = state.done == '1'
local pinned = state.pinned == '1'
local created = 0
if stored_gen == nil or stored_step == nil then
  -- nothing trustworthy is stored (none, lost, or malformed; a begun
  -- generation's fence alone is no state, and nothing to repair)
  if redis.call('EXISTS', KEYS[1]) == 1 and not fence then repaired = 1 end
  stored_gen = nil
  stored_step = nil
end
local vouch = ARGV[9]
if contributor then
  if stored_gen == nil or was_done or pinned or stored_run ~= run_id then
    return {3, '-1', '0', repaired, 0}
  end
  if fence and fence > stored_gen then
    -- a newer chief has begun: join it once it has written (a contributor that
    -- has not joined yet), or stop (one of an older generation)
    if generation == 0 then return {3, '-1', '0', repaired, 0} end
    return {4, string.format('%.0f', stored_step), string.format('%.0f', fence), repaired, 0}
  end
  if stored_gen ~= generation then
    return {4, string.format('%.0f', stored_step), string.format('%.0f', stored_gen), repaired, 0}
  end
  if step > stored_step then
    redis.call('HSET', KEYS[1], 'step', string.format('%.0f', step))
    stored_step = step
  end
  -- the vouch stays the chief's: a contributor can neither end a chief's
  -- probation nor revive a step its chief stopped vouching for
else
  if (stored_gen ~= nil and stored_gen > generation) or (fence and fence > generation) then
    return {0, string.format('%.0f', stored_step or -1),
            string.format('%.0f', math.max(stored_gen or 0, fence or 0)), repaired, 0}
  end
  if stored_gen == nil or stored_gen < generation then
    if stored_gen == nil and mode == 'chief' and ARGV[15] ~= '1' then
      -- Redis forgot the state (or this is the job's first write): a zombie
      -- may be the one writing now, so this state vouches for nothing until
      -- the writer's probation ends (docs/protocol.md#probation)
      created = 1
      vouch = '0'
    end
    redis.call('UNLINK', KEYS[1])
    redis.call('HSET', KEYS[1], 'generation', string.format('%.0f', generation),
               'step', string.format('%.0f', step), 'done', '0', 'run_id', run_id,
               'pinned', mode == 'operator' and '1' or '0')
    -- a (re)made state's beat starts from the Redis clock (us), so that it is above
    -- every beat a waiter saw before Redis forgot the state: the count goes on
    -- rising, and the waiter sees the next write happen (docs/protocol.md#keys)
    local clock = redis.call('TIME')
    stored_gen, stored_step, was_done = generation, step, false
    beat = tonumber(clock[1]) * 1000000 + tonumber(clock[2]) - 1
    pinned = mode == 'operator'
  elseif step > stored_step then
    redis.call('HSET', KEYS[1], 'step', string.format('%.0f', step))
    stored_step = step
  end
  if ARGV[3] == '1' and not was_done then
    redis.call('HSET', KEYS[1], 'done', '1', 'done_ms', string.format('%.0f', now))
    was_done = true
  end
  redis.call('HSET', KEYS[1], 'chief', ARGV[6], 'heartbeat_period_ms', ARGV[10],
             'vouch', vouch, 'reset_seen', ARGV[12])
end
beat = beat + 1
redis.call('HSET', KEYS[1], 'beat', string.format('%.0f', beat),
           'heartbeat_ms', string.format('%.0f', now))
-- a finished job's keys live for ARGV[11]: long enough for a worker cut off
-- while it finished to read it after its link is back
local ttl = tonumber(ARGV[4])
if was_done and tonumber(ARGV[11]) < ttl then ttl = tonumber(ARGV[11]) end
redis.call('EXPIRE', KEYS[1], ttl)
local step_text = string.format('%.0f', stored_step)
local gen_text = string.format('%.0f', stored_gen)
-- the vouch as stored: the writer's (a chief or operator), or the chief's, as read
-- (a contributor's write leaves it)
local stored_vouch = vouch
if contributor then stored_vouch = state.vouch or '0' end
if stored_vouch == '1' or pinned then
  -- waiters at or below a vouched step are released by this write: they leave
  -- the index here, so that a released worker need not spend a round trip
  -- unregistering (its entry expires by itself). At most MAX_REMOVED per write
  -- (ZCOUNT then by rank: the lowest scores are exactly those at or below the
  -- step), whatever a worker put there; the rest go at the next writes
  local reached = math.min(redis.call('ZCOUNT', KEYS[2], '-inf', step_text), MAX_REMOVED)
  if reached > 0 then redis.call('ZREMRANGEBYRANK', KEYS[2], 0, reached - 1) end
end
redis.call(publish_command(ARGV[14]), ARGV[5], string.format(
  '{"step":%s,"generation":%s,"beat":%s,"vouch":%s,"done":%s,"pinned":%s,"run_id":"%s"}',
  step_text, gen_text, string.format('%.0f', beat), stored_vouch == '1' and 'true' or 'false',
  was_done and 'true' or 'false', pinned and 'true' or 'false', run_id))
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('EXPIRE', KEYS[2], ttl) end
local result = {1, step_text, gen_text, repaired, created}
-- only whole steps in range guide the chief: a hostile +inf score is skipped;
-- at most MAX_TARGETS_READ, whatever the caller asks
local wanted = math.min(math.max(tonumber(ARGV[7]) or 0, 0), MAX_TARGETS_READ)
local above = string.format('%.0f', MAX_STEP)
local pending = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. step_text, above,
                           'WITHSCORES', 'LIMIT', 0, wanted)
for i = 2, #pending, 2 do
  local target = whole(pending[i])
  if target then result[#result + 1] = pending[i] end
end
return result
"""

_RESET_JOB = """
-- KEYS[1] state, KEYS[2] targets, KEYS[3] registrations, KEYS[4] reset marker,
-- KEYS[5] barrier index, KEYS[6] barrier epoch, KEYS[7..] waiter registry keys
-- (and the barrier hashes the index names, deleted only to tidy up): at most
-- MAX_RESET_KEYS of those, else nothing is done (so the call is short however
-- many keys a job has: `stepbarrier reset` deletes the other entries beforehand,
-- and the new epoch makes every barrier stale, named here or not);
-- ARGV[1] channel, ARGV[2] marker TTL (s), ARGV[3] 'PUBLISH' or 'SPUBLISH' (see
-- PUBLISH_STEP), ARGV[4] barrier channel
-- Deletes the job's keys (UNLINK: a large key's memory is freed off the main
-- thread), leaves a new marker (a token: the Redis time in ms of the reset,
-- made greater than the one before) so that waiters who missed the
-- announcement still abort and chiefs begun before it stop, and announces it
-- on both channels. A new barrier epoch makes every barrier begun before the
-- reset stale at once, whatever the index names (see BARRIER_ARRIVE). Returns
-- the marker.
if #KEYS < 6 or #KEYS > 6 + MAX_RESET_KEYS then
  return redis.error_reply('ERR stepbarrier: a reset names its 6 keys and at most ' ..
                           MAX_RESET_KEYS .. ' waiter entries and barriers')
end
local epoch_clock = redis.call('TIME')
local epoch = tonumber(epoch_clock[1]) * 1000000 + tonumber(epoch_clock[2])
local epoch_kind, epoch_fields = read_hash(KEYS[6], EPOCH_FIELDS, MAX_FIELDS)
if epoch_kind == 'hash' then
  local stored = whole(epoch_fields.token)
  if stored and stored >= epoch and stored < MAX_STEP then epoch = stored + 1 end
end
for i = 5, #KEYS do redis.call('UNLINK', KEYS[i]) end
redis.call('HSET', KEYS[6], 'token', string.format('%.0f', epoch), 'by', 'reset')
redis.call('EXPIRE', KEYS[6], ARGV[2])
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3])
local now = redis.call('TIME')
local marker = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
-- the marker is a token (its value is also the reset's time, for operators):
-- it must differ from the one before, even for two resets in one millisecond
local previous = whole(short_string(KEYS[4], MAX_MARKER))
if previous and previous >= marker then marker = previous + 1 end
local now_ms = string.format('%.0f', marker)
redis.call('SET', KEYS[4], now_ms, 'EX', ARGV[2])
local notice = '{"reset":true,"time_ms":' .. now_ms .. '}'
redis.call(publish_command(ARGV[3]), ARGV[1], notice)
if ARGV[4] then redis.call(publish_command(ARGV[3]), ARGV[4], notice) end
return now_ms
"""

_WAITER_REGISTER = """
-- KEYS[1] this waiter's registry hash, KEYS[2] targets zset, KEYS[3] registrations list
-- ARGV[1] registry TTL (s), ARGV[2] key TTL (s), ARGV[3] waiter id, ARGV[4] target,
-- ARGV[5..] registry fields and values (at most MAX_FIELDS pairs)
-- (Re-)registers the waiter if its entry is gone (first call, expiry, or a Redis
-- restarted empty) or refreshes the entry's TTL, and puts its target back in the
-- targets zset (the job's index of waiters, which the chief relearns from even
-- if the zset was lost). Only what a waiter writes is declared: Redis's ACL
-- demands read AND write permission on every key that FCALL/EVAL declares.
if #ARGV < 4 or #ARGV > 4 + 2 * MAX_FIELDS then
  return redis.error_reply('ERR stepbarrier: a waiter entry has at most ' .. MAX_FIELDS ..
                           ' fields')
end
local fresh_entry = redis.call('EXPIRE', KEYS[1], ARGV[1]) == 0
if fresh_entry then
  local entry = {}
  for i = 5, #ARGV do entry[#entry + 1] = ARGV[i] end
  redis.call('UNLINK', KEYS[1])
  redis.call('HSET', KEYS[1], unpack(entry))
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
-- the targets and the list only guide the chief: a malformed one is skipped
if pcall(redis.call, 'ZADD', KEYS[2], ARGV[4], ARGV[3]) then
  redis.call('EXPIRE', KEYS[2], ARGV[2])
end
if fresh_entry then
  -- the list keeps the newest MAX_REGISTRATIONS: a trim removes at most that
  -- many, and a list twice as long (pushed by hand) is dropped whole first
  local ok, length = pcall(redis.call, 'LLEN', KEYS[3])
  if ok then
    if length >= 2 * MAX_REGISTRATIONS then
      redis.call('UNLINK', KEYS[3])
      length = 0
    end
    redis.call('RPUSH', KEYS[3], ARGV[4])
    if length >= MAX_REGISTRATIONS then redis.call('LTRIM', KEYS[3], -MAX_REGISTRATIONS, -1) end
    redis.call('EXPIRE', KEYS[3], ARGV[2])
  end
end
return 1
"""

_WAITER_READ = """
-- KEYS[1] a hash: the job's state, or a named barrier (a key under
-- stepbarrier:{JOB}:barrier:, the epoch included), KEYS[2] reset marker (read
-- only: FCALL_RO, no write permission needed)
-- Returns the Redis time, the reset marker and the hash:
--   {now_ms, reset marker or false, kind, field/value pairs...}
-- Only known fields are read: a state's STATE_FIELDS; a barrier's BARRIER_FIELDS
-- and EPOCH_FIELDS, then t0 .. t<parties - 1> of a barrier with valid parties.
-- kind is the key's type, or 'oversized' (nothing of it read): a hash of more
-- than MAX_FIELDS fields (a barrier: MAX_FIELDS + its parties), or a known
-- field longer than MAX_VALUE bytes (a task's: MAX_TASK_VALUE). A marker longer
-- than MAX_MARKER reads as 'oversized'.
local result = {string.format('%.0f', now_ms())}
local marker = short_string(KEYS[2], MAX_MARKER)
if marker == false then marker = 'oversized' elseif marker == nil then marker = false end
result[2] = marker
local barrier = string.find(KEYS[1], '}:barrier:', 1, true) ~= nil
local names = STATE_FIELDS
if barrier then
  names = {}
  for _, name in ipairs(BARRIER_FIELDS) do names[#names + 1] = name end
  for _, name in ipairs(EPOCH_FIELDS) do names[#names + 1] = name end
end
local kind, fields, length = read_hash(KEYS[1], names, MAX_FIELDS + (barrier and MAX_PARTIES or 0))
local parties = barrier and kind == 'hash' and barrier_parties(fields) or 0
if kind == 'hash' and length > MAX_FIELDS + parties then kind = 'oversized' end
result[3] = kind
if kind ~= 'hash' then return result end
for _, name in ipairs(names) do
  if fields[name] then
    result[#result + 1] = name
    result[#result + 1] = fields[name]
  end
end
for first = 0, parties - 1, 1000 do
  local tasks = {}
  for id = first, math.min(first + 999, parties - 1) do tasks[#tasks + 1] = 't' .. id end
  local values = field_values(KEYS[1], tasks, MAX_TASK_VALUE)
  if values == nil then return {result[1], result[2], 'oversized'} end
  for i = 1, #tasks do
    if values[i] then
      result[#result + 1] = tasks[i]
      result[#result + 1] = values[i]
    end
  end
end
return result
"""

_WAITER_LEAVE = """
-- KEYS[1] this waiter's registry hash, KEYS[2] targets zset; ARGV[1] waiter id
redis.call('UNLINK', KEYS[1])
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
