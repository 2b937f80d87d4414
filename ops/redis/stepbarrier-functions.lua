#!lua name=stepbarrier_v4

local MAX_STEP = 9007199254740990
local MAX_FIELDS, MAX_VALUE, MAX_TASK_VALUE = 32, 256, 16
local MAX_MARKER, MAX_PARTIES, MAX_BARRIER_INDEX = 64, 10000, 1000
local MAX_TARGETS_READ, MAX_REMOVED = 1000, 1000
local MAX_REGISTRATIONS, MAX_RESET_KEYS = 1000, 2000
local MAX_ARGUMENT, MAX_RESTORED, MAX_WRITE_KEYS = 256, 1000, 8
local MAX_INDEX_READ, MAX_JOB_INDEX = 10000, 9999
local MAX_LIFETIME = 315360000
local MAX_TASK_ID, MAX_PROGRESS_TASKS = 1000000, 10000
local MAX_PROGRESS_VALUE = 33
local STATE_FIELDS = {'generation', 'step', 'beat', 'run_id', 'vouch', 'fence', 'begun', 'probation', 'done', 'pinned', 'reset_seen', 'chief', 'heartbeat_ms', 'done_ms', 'heartbeat_period_ms', 'idle_ms'}
local WAIT_FIELDS = {'generation', 'step', 'beat', 'run_id', 'vouch', 'fence', 'done', 'pinned', 'idle_ms'}
local BARRIER_FIELDS = {'parties', 'arrived', 'created_ms', 'run_id', 'epoch', 'last_ms', 'completed_ms'}
local EPOCH_FIELDS = {'token', 'by'}

local function whole(text)
  -- One definition of a stored number, the same as Python's wire.parse_int:
  -- 1 to 16 ASCII digits (no sign, space, exponent or hex), at most MAX_STEP
  -- (2^53 - 2, so that n + 1 is exact in doubles); a larger one is malformed (nil).
  if type(text) ~= 'string' or #text > 16 or not string.match(text, '^%d+$') then return nil end
  local n = tonumber(text)
  if n and n <= MAX_STEP then return n end
  return nil
end
local function above(number, stored)
  -- `number` raised to stored + 1 if `stored` (a whole number, or nil) is not
  -- below it: so a new generation, epoch or marker is above what is stored, and
  -- at most MAX_STEP. A stored MAX_STEP leaves no valid number above it: it is
  -- passed over (to its caller, malformed), and `number` is returned as it is
  if stored and stored >= number and stored < MAX_STEP then return stored + 1 end
  return number
end
local function at_limit(...)
  -- true if one of these stored texts is MAX_STEP: nothing can be numbered above
  -- it, so whoever must (a begin, above a stored generation, fence or begun)
  -- treats it as malformed
  for i = 1, select('#', ...) do
    if whole((select(i, ...))) == MAX_STEP then return true end
  end
  return false
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
local function compact(key)
  -- true if the hash is a listpack (ziplist before Redis 7): Redis keeps one only
  -- while every value is at most hash-max-listpack-value bytes, which the
  -- operator keeps at most MAX_ARGUMENT (docs/protocol.md#bounds), so HMGET of
  -- it copies no more than the arguments could. false for anything else, and
  -- under a users.acl without +object|encoding (the per-field checks then)
  local ok, encoding = pcall(redis.call, 'OBJECT', 'ENCODING', key)
  return ok and (encoding == 'listpack' or encoding == 'listpackex' or encoding == 'ziplist')
end
local function field_values(key, names, limit)
  -- HMGET of `names` (false: absent), or nil if one of them is longer than `limit`
  -- bytes: O(#names), whatever else the hash holds. A compact hash is read at
  -- once and its values measured here; another has each value's length asked
  -- first (HSTRLEN), so that no large value is ever copied
  if compact(key) then
    local values = redis.call('HMGET', key, unpack(names))
    for i = 1, #names do
      if values[i] and #values[i] > limit then return nil end
    end
    return values
  end
  for i = 1, #names do
    if redis.call('HSTRLEN', key, names[i]) > limit then return nil end
  end
  return redis.call('HMGET', key, unpack(names))
end
local function read_hash(key, names, max_fields)
  -- kind, fields (name -> value), length. kind: the key's type, or 'oversized'
  -- (more than max_fields fields, or a value of `names` over MAX_VALUE bytes):
  -- then nothing of it is read. HLEN first: it answers for a hash and for no key
  -- (0: a hash has at least one field); TYPE only when it refused another type
  local ok, length = pcall(redis.call, 'HLEN', key)
  if not ok then
    local kind = redis.call('TYPE', key).ok
    -- a hash whose HLEN was refused (not by its type): the refusal is the call's
    if kind == 'hash' then error(length) end
    return kind, {}, 0
  end
  if length == 0 then return 'none', {}, 0 end
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
local function refused(message)
  -- the library's refusal of a call, in its one style (ERR stepbarrier: ...)
  return redis.error_reply('ERR stepbarrier: ' .. message)
end
local function count_text(low, high)
  if low == high then return tostring(low) end
  return low .. ' to ' .. high
end
local function called(keys, args, what, key_low, key_high, arg_low, arg_high)
  -- nil if a call names key_low..key_high keys and passes arg_low..arg_high
  -- arguments, none longer than MAX_ARGUMENT bytes; else the refusal to return.
  -- Every function checks this first, before it reads, writes or loops over
  -- anything: its loops over arguments are bounded by these counts (a key's
  -- name costs nothing but its hashing, so only the arguments' sizes count)
  if #keys < key_low or #keys > key_high or #args < arg_low or #args > arg_high then
    return refused(what .. ' names ' .. count_text(key_low, key_high) .. ' keys and takes ' ..
                   count_text(arg_low, arg_high) .. ' arguments, not ' .. #keys .. ' and ' ..
                   #args)
  end
  for i = 1, #args do
    if #args[i] > MAX_ARGUMENT then
      return refused(what .. ': argument ' .. i .. ' is longer than ' .. MAX_ARGUMENT .. ' bytes')
    end
  end
  return nil
end
local function positive(text)
  -- a whole number of at least 1 (a TTL), or nil
  local n = whole(text)
  if n and n >= 1 then return n end
  return nil
end
local function run_id_ok(text)
  -- a run id as Python validates it: at most 64 letters, digits, '.', '_' or '-'
  return #text <= 64 and string.match(text, '^[%w._-]*$') ~= nil
end
local function publish_ok(name)
  return name == 'PUBLISH' or name == 'SPUBLISH'
end

local function begin_generation(KEYS, ARGV)
-- KEYS[1] state hash, KEYS[2] reset marker; ARGV[1] the caller's run id ('' for none),
-- ARGV[2] the caller's floor: the highest generation it knows of ('0': none)
-- Returns a generation number above every one this job's state shows and the
-- caller knows of (the Redis clock in microseconds, or the stored generation,
-- fence or begun + 1, or the floor + 1, whichever is highest: the clock went
-- back, or two chiefs began in the same microsecond), records it as `begun`
-- (whoever's state it is: the new generation's first write then needs no
-- probation) and, on its own run's state or on none, as the state's fence, so
-- that an older generation's writes are refused from the begin on
-- (docs/protocol.md#generations),
-- and what the new chief must know before its first write:
--   {generation, reset marker ('' for none), stored run id, stored beat,
--    stored done (0/1), stored chief, stored generation ('0' for none)}
-- The reset marker is a token: the chief's writes carry it, and a write under
-- another marker is refused (docs/protocol.md#reset). A marker longer than
-- MAX_MARKER reads as 'oversized', and an oversized state (see read_hash) as
-- another type's key: no state, left alone (the next write replaces it).
local refusal = called(KEYS, ARGV, 'a begin', 2, 2, 1, 2)
if refusal then return refusal end
if not run_id_ok(ARGV[1]) then return refused('malformed run id') end
if ARGV[2] and ARGV[2] ~= '' and not whole(ARGV[2]) then
  return refused('the floor is a whole number')
end
local now = redis.call('TIME')
local generation = tonumber(now[1]) * 1000000 + tonumber(now[2])
generation = above(generation, whole(ARGV[2] or ''))
local run, beat, done, chief, stored = '', '0', '0', '', nil
local kind, state = read_hash(KEYS[1], STATE_FIELDS, MAX_FIELDS)
if kind == 'hash' and at_limit(state.generation, state.fence, state.begun) then
  -- no generation can be numbered above MAX_STEP (2^53 - 2 us is the year 2255:
  -- only a hand writes it): the hash is malformed, and goes, as a write would
  -- replace it; the begin then finds no state
  redis.call('UNLINK', KEYS[1])
  kind, state = 'none', {}
end
if kind == 'hash' then
  stored = whole(state.generation)
  if stored and whole(state.step) then
    generation = above(generation, stored)
    -- the new generation fences the older ones from now on, not only from its
    -- first write: a write of a generation below the fence is superseded
    generation = above(generation, whole(state.fence))
    generation = above(generation, whole(state.begun))
    run = state.run_id or ''
    -- only its own run's state: another run's chief is watched, not fenced
    -- (docs/protocol.md#runs)
    if run == (ARGV[1] or '') then
      redis.call('HSET', KEYS[1], 'fence', string.format('%.0f', generation))
    end
    redis.call('HSET', KEYS[1], 'begun', string.format('%.0f', generation))
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
  generation = above(generation, whole(state.fence))
  generation = above(generation, whole(state.begun))
  redis.call('HSET', KEYS[1], 'fence', string.format('%.0f', generation),
             'begun', string.format('%.0f', generation))
  redis.call('EXPIRE', KEYS[1], 86400)
end
local marker = short_string(KEYS[2], MAX_MARKER)
if marker == false then marker = 'oversized' elseif marker == nil then marker = '' end
return {string.format('%.0f', generation), marker, string.sub(run, 1, 64),
        string.sub(beat, 1, 16), string.sub(done, 1, 1), string.sub(chief, 1, 200),
        stored and string.format('%.0f', stored) or '0'}
end
redis.register_function{function_name='stepbarrier_v4_begin_generation', callback=begin_generation, flags={}}
local function publish_step(KEYS, ARGV)
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
-- ARGV[15] the probation this writer has served: the `probation` id a reply showed
-- it, once FENCE has passed on its own clock since ('0': none), ARGV[16] how
-- long ago the writer's training loop handed its last step over (ms, the
-- writer's own clock; 0 in a pause between sessions): a duration, never
-- compared with a clock; a waiter's stall timeout judges the loop by it.
-- The rules are docs/protocol.md's. A chief (or operator) stores the step if it
-- is greater (same generation) or replaces the state (newer generation, or
-- none stored); a contributor only raises the step of the generation it
-- joined. Every accepted write adds one to the generation's beat (waiters
-- judge liveness by the beat moving while they watch, never by clocks) and is
-- announced. Returns
--   {status, stored step, stored generation, repaired (0/1), probation id ('0': none),
--    pending targets...}
-- status: 1 accepted, 0 superseded, 2 reset after the writer began,
--         3 nothing to join (contributor), 4 another generation (contributor).
-- probation: a chief write that makes or replaces the state without its own
-- begin on record (`begun` equal to its generation) may be a zombie's whose
-- successor's state Redis forgot (or the successor's own, replacing a zombie's
-- state: it cannot tell either). That state is on probation, stored here as
-- `probation` = the beat of the write that made it: it vouches for nothing
-- until its writer, having learned the id from a reply (any reply: a lost one
-- costs nothing), has waited FENCE on its own clock and says so (ARGV[15])
-- (docs/protocol.md#probation).
local refusal = called(KEYS, ARGV, 'a write', 3, 3, 15, 16)
if refusal then return refusal end
local generation = whole(ARGV[1])
local step = whole(ARGV[2])
local run_id = ARGV[8]
local mode = ARGV[13]
local contributor = mode == 'contributor'
if not run_id_ok(run_id) then return refused('malformed run id') end
local function flag(text) return text == '0' or text == '1' end
if not (generation and step and flag(ARGV[3]) and positive(ARGV[4]) and whole(ARGV[7])
        and flag(ARGV[9]) and whole(ARGV[10]) and positive(ARGV[11]) and whole(ARGV[15])
        and (ARGV[16] == nil or whole(ARGV[16])) and publish_ok(ARGV[14])
        and (mode == 'chief' or contributor or mode == 'operator')) then
  return refused('malformed arguments: a write takes whole numbers, flags of 0 or 1, '
                 .. 'PUBLISH or SPUBLISH, and the mode chief, contributor or operator')
end
local now = now_ms()
local repaired = 0
if not contributor then
  -- the marker is a token: any marker but the one this writer began under
  -- means a reset came after it began (equality only: no clock is compared);
  -- an oversized one equals no writer's ('oversized' is what a begin read)
  local marker = short_string(KEYS[3], MAX_MARKER)
  if marker == false or (marker ~= nil and marker ~= ARGV[12]) then return {2, '-1', '0', 0, '0'} end
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
-- a beat of MAX_STEP leaves no room for the next one: malformed, counted from nothing
local beat = whole(state.beat) or 0
if at_limit(state.beat) then beat = 0 end
local was_done = state.done == '1'
local pinned = state.pinned == '1'
local begun = whole(state.begun)
local probation = whole(state.probation)
if probation == 0 then probation = nil end  -- '0': served (no role may HDEL)
if stored_gen == nil or stored_step == nil then
  -- nothing trustworthy is stored (none, lost, or malformed; a begun
  -- generation's fence alone is no state, and nothing to repair)
  local begins = (state.fence and 1 or 0) + (state.begun and 1 or 0)
  if redis.call('EXISTS', KEYS[1]) == 1 and redis.call('HLEN', KEYS[1]) > begins then
    repaired = 1
  end
  stored_gen = nil
  stored_step = nil
end
local vouch = ARGV[9]
if contributor then
  if stored_gen == nil or was_done or pinned or stored_run ~= run_id then
    return {3, '-1', '0', repaired, '0'}
  end
  if fence and fence > stored_gen then
    -- a newer chief has begun: join it once it has written (a contributor that
    -- has not joined yet), or stop (one of an older generation)
    if generation == 0 then return {3, '-1', '0', repaired, '0'} end
    return {4, string.format('%.0f', stored_step), string.format('%.0f', fence), repaired, '0'}
  end
  if stored_gen ~= generation then
    return {4, string.format('%.0f', stored_step), string.format('%.0f', stored_gen), repaired, '0'}
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
            string.format('%.0f', math.max(stored_gen or 0, fence or 0)), repaired, '0'}
  end
  if stored_gen == nil or stored_gen < generation then
    -- its own begin on record means no newer begin came since and Redis did
    -- not forget since: the writer is the newest, and needs no probation
    local on_probation = mode == 'chief' and begun ~= generation
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
    probation = nil
    if on_probation then
      probation = beat + 1  -- this write's beat: unique to this making of the state
      redis.call('HSET', KEYS[1], 'probation', string.format('%.0f', probation))
    end
  else
    if step > stored_step then
      redis.call('HSET', KEYS[1], 'step', string.format('%.0f', step))
      stored_step = step
    end
    if probation and ARGV[15] == string.format('%.0f', probation) then
      -- the writer waited FENCE after it learned of this very probation
      redis.call('HSET', KEYS[1], 'probation', '0')
      probation = nil
    end
  end
  if probation then vouch = '0' end
  if ARGV[3] == '1' and not was_done then
    redis.call('HSET', KEYS[1], 'done', '1', 'done_ms', string.format('%.0f', now))
    was_done = true
  end
  redis.call('HSET', KEYS[1], 'chief', ARGV[6], 'heartbeat_period_ms', ARGV[10],
             'vouch', vouch, 'reset_seen', ARGV[12])
end
beat = beat + 1
local idle = whole(ARGV[16] or '') or 0
redis.call('HSET', KEYS[1], 'beat', string.format('%.0f', beat),
           'heartbeat_ms', string.format('%.0f', now), 'idle_ms', string.format('%.0f', idle))
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
  '{"step":%s,"generation":%s,"beat":%s,"vouch":%s,"done":%s,"pinned":%s,"run_id":"%s",'
  .. '"idle":%s}',
  step_text, gen_text, string.format('%.0f', beat), stored_vouch == '1' and 'true' or 'false',
  was_done and 'true' or 'false', pinned and 'true' or 'false', run_id,
  string.format('%.0f', idle)))
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('EXPIRE', KEYS[2], ttl) end
local result = {1, step_text, gen_text, repaired, probation and string.format('%.0f', probation) or '0'}
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
end
redis.register_function{function_name='stepbarrier_v4_publish_step', callback=publish_step, flags={}}
local function reset_job(KEYS, ARGV)
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
  return refused('a reset names its 6 keys and at most ' .. MAX_RESET_KEYS ..
                 ' waiter entries and barriers')
end
local refusal = called(KEYS, ARGV, 'a reset', 6, 6 + MAX_RESET_KEYS, 3, 4)
if refusal then return refusal end
if not positive(ARGV[2]) or not publish_ok(ARGV[3]) then
  return refused('a reset takes a channel, a TTL, PUBLISH or SPUBLISH and a channel')
end
local epoch_clock = redis.call('TIME')
local epoch = tonumber(epoch_clock[1]) * 1000000 + tonumber(epoch_clock[2])
local epoch_kind, epoch_fields = read_hash(KEYS[6], EPOCH_FIELDS, MAX_FIELDS)
if epoch_kind == 'hash' then
  epoch = above(epoch, whole(epoch_fields.token))
end
for i = 5, #KEYS do redis.call('UNLINK', KEYS[i]) end
redis.call('HSET', KEYS[6], 'token', string.format('%.0f', epoch), 'by', 'reset')
redis.call('EXPIRE', KEYS[6], ARGV[2])
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3])
local now = redis.call('TIME')
local marker = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
-- the marker is a token (its value is also the reset's time, for operators):
-- it must differ from the one before, even for two resets in one millisecond
-- (a stored MAX_STEP leaves no room above it: the marker is then the time, which
-- differs from it all the same)
marker = above(marker, whole(short_string(KEYS[4], MAX_MARKER)))
local now_ms = string.format('%.0f', marker)
redis.call('SET', KEYS[4], now_ms, 'EX', ARGV[2])
local notice = '{"reset":true,"time_ms":' .. now_ms .. '}'
redis.call(publish_command(ARGV[3]), ARGV[1], notice)
if ARGV[4] then redis.call(publish_command(ARGV[3]), ARGV[4], notice) end
return now_ms
end
redis.register_function{function_name='stepbarrier_v4_reset_job', callback=reset_job, flags={}}
local function waiter_register(KEYS, ARGV)
-- KEYS[1] this waiter's registry hash, KEYS[2] targets zset, KEYS[3] registrations list
-- ARGV[1] registry TTL (s), ARGV[2] key TTL (s), ARGV[3] waiter id, ARGV[4] target,
-- ARGV[5..] registry fields and values (at most MAX_FIELDS pairs, each at most
-- MAX_ARGUMENT bytes)
-- (Re-)registers the waiter if its entry is gone (first call, expiry, or a Redis
-- restarted empty), or refreshes the entry's TTL and fields (a waiter that waits
-- again under its id: the entry says the new wait), and puts its target back in
-- the targets zset (the job's index of waiters, which the chief relearns from
-- even if the zset was lost). Only a target new to the index (a new member, or
-- a member's new score) or a new entry is pushed onto the registrations list,
-- which wakes the chief: a refresh of the same wait costs the chief nothing.
-- And only if no other waiter is indexed at that target: the chief has it
-- already (from that waiter's push, or from the index its last write read), so
-- a fleet waiting for one step wakes the chief once, not once per waiter.
-- Only what a waiter writes is declared: Redis's ACL demands read AND write
-- permission on every key that FCALL/EVAL declares.
if #ARGV < 4 or #ARGV > 4 + 2 * MAX_FIELDS or (#ARGV - 4) % 2 ~= 0 then
  return refused('a waiter entry has at most ' .. MAX_FIELDS .. ' fields, each a name and a value')
end
local refusal = called(KEYS, ARGV, 'a registration', 3, 3, 4, 4 + 2 * MAX_FIELDS)
if refusal then return refusal end
if not positive(ARGV[1]) or not positive(ARGV[2]) or not tonumber(ARGV[4]) then
  return refused('a registration takes two TTLs, a waiter id and a target step')
end
local fresh_entry = redis.call('EXPIRE', KEYS[1], ARGV[1]) == 0
-- an entry there is this waiter's: its fields are written over (HSET costs what
-- its arguments do, whatever the hash holds); anything else there is replaced. No
-- entry (EXPIRE found no key: the first wait, or one its release removed): written
if #ARGV > 4 then
  if fresh_entry then
    redis.call('HSET', KEYS[1], unpack(ARGV, 5))
    redis.call('EXPIRE', KEYS[1], ARGV[1])
  elseif not pcall(redis.call, 'HSET', KEYS[1], unpack(ARGV, 5)) then
    redis.call('UNLINK', KEYS[1])
    redis.call('HSET', KEYS[1], unpack(ARGV, 5))
    redis.call('EXPIRE', KEYS[1], ARGV[1])
  end
end
-- the targets and the list only guide the chief: a malformed one is skipped
local push = fresh_entry
local ok, changed = pcall(redis.call, 'ZADD', KEYS[2], 'CH', ARGV[4], ARGV[3])
if ok then
  push = push or changed == 1
  -- a push candidate: the waiters indexed at the target, this one included (a
  -- users.acl without +zcount refuses it: then every candidate is pushed, as before)
  local counted, indexed = true, 1
  if push then counted, indexed = pcall(redis.call, 'ZCOUNT', KEYS[2], ARGV[4], ARGV[4]) end
  if counted and indexed > 1 then push = false end
  -- a zset this ZADD made is a push (no waiter was at its target): its TTL is set
  -- here; the chief's writes refresh it (and a refresh of the same wait needs none)
  if push or not counted then redis.call('EXPIRE', KEYS[2], ARGV[2]) end
end
if push then
  -- the list keeps the newest MAX_REGISTRATIONS: a trim removes at most that
  -- many, and a list twice as long (pushed by hand) is dropped whole
  local pushed, length = pcall(redis.call, 'RPUSH', KEYS[3], ARGV[4])
  if not pushed then
    -- a key of another type is skipped; any other refusal (the caller's ACL) is
    -- the call's
    local message = type(length) == 'table' and tostring(length.err) or tostring(length)
    if not string.find(message, 'WRONGTYPE', 1, true) then return redis.error_reply(message) end
  else
    if length > 2 * MAX_REGISTRATIONS then
      redis.call('UNLINK', KEYS[3])
      redis.call('RPUSH', KEYS[3], ARGV[4])
    elseif length > MAX_REGISTRATIONS then
      redis.call('LTRIM', KEYS[3], -MAX_REGISTRATIONS, -1)
    end
    redis.call('EXPIRE', KEYS[3], ARGV[2])
  end
end
return 1
end
redis.register_function{function_name='stepbarrier_v4_waiter_register', callback=waiter_register, flags={}}
local function waiter_read(KEYS, ARGV)
-- KEYS[1] a hash: the job's state, or a named barrier (under
-- stepbarrier:{JOB}:barrier:, the epoch included), KEYS[2] reset marker (read
-- only: FCALL_RO); ARGV (optional): 'wait', a waiter's read of the state (only
-- WAIT_FIELDS, now_ms '0'); or 'party', parties, task id: a party's read of a barrier
-- Returns {now_ms, reset marker or false, kind, field/value pairs...}: a state's
-- STATE_FIELDS (a wait's WAIT_FIELDS; of a listpack state, kind 'values' and the
-- values alone, in WAIT_FIELDS' order, false for an absent one); a barrier's
-- BARRIER_FIELDS, EPOCH_FIELDS and
-- t0 .. t<parties - 1> (a party's: its own parties), or while HLEN less the own
-- fields is below a party's parties (they cannot be complete), in O(1): kind
-- 'counted', its own t<task> and 'tasks' (that bound). kind is else the key's type,
-- or 'oversized' (nothing read): more than MAX_FIELDS fields (a barrier: plus its
-- parties), or a known field over MAX_VALUE bytes (a task's: MAX_TASK_VALUE); so is
-- a marker over MAX_MARKER. Its one loop (at most MAX_PARTIES task fields) only
-- reads: FUNCTION KILL can end it.
local refusal = called(KEYS, ARGV, 'a read', 2, 2, 0, 3)
if refusal then return refusal end
local wait, own = ARGV[1] == 'wait' and #ARGV == 1, nil
local caller, task = whole(ARGV[2]), whole(ARGV[3])
if ARGV[1] == 'party' and caller and task and task < caller and caller <= MAX_PARTIES then
  own = 't' .. string.format('%.0f', task)
elseif #ARGV > 0 and not wait then
  return refused("a read takes no argument, 'wait', or 'party', the parties and a task id")
end
local result = {wait and '0' or string.format('%.0f', now_ms())}
local marker = short_string(KEYS[2], MAX_MARKER)
if marker == false then marker = 'oversized' elseif marker == nil then marker = false end
result[2] = marker
local barrier = string.find(KEYS[1], '}:barrier:', 1, true) ~= nil
if wait and not barrier then
  -- a wait's read of a listpack state, the common case: the same checks as the
  -- general path below, and the values alone, in WAIT_FIELDS' order (kind
  -- 'values'), which costs Redis about 40% less than the named pairs
  local ok, length = pcall(redis.call, 'HLEN', KEYS[1])
  if ok and length > 0 and length <= MAX_FIELDS and compact(KEYS[1]) then
    local values = redis.call('HMGET', KEYS[1], unpack(WAIT_FIELDS))
    for i = 1, #WAIT_FIELDS do
      if values[i] and #values[i] > MAX_VALUE then return {result[1], result[2], 'oversized'} end
    end
    return {result[1], result[2], 'values', unpack(values)}
  end
end
local names = wait and WAIT_FIELDS or STATE_FIELDS
if barrier then
  names = {}
  for _, name in ipairs(BARRIER_FIELDS) do names[#names + 1] = name end
  for _, name in ipairs(EPOCH_FIELDS) do names[#names + 1] = name end
end
local kind, fields, length = read_hash(KEYS[1], names, MAX_FIELDS + (barrier and MAX_PARTIES or 0))
local parties = barrier and kind == 'hash' and barrier_parties(fields) or 0
if kind == 'hash' and length > MAX_FIELDS + parties then kind = 'oversized' end
local tasks = length
result[3] = kind
for _, name in ipairs(names) do
  if fields[name] then
    result[#result + 1] = name
    result[#result + 1] = fields[name]
    tasks = tasks - 1
  end
end
if kind ~= 'hash' then return {result[1], result[2], kind} end
if own and barrier and tasks < caller then
  -- the arrivals cannot be complete: O(1), the caller's own arrival and the bound
  result[3] = 'counted'
  local value = field_values(KEYS[1], {own}, MAX_TASK_VALUE)
  if value and value[1] then
    result[#result + 1] = own
    result[#result + 1] = value[1]
  end
  result[#result + 1] = 'tasks'
  result[#result + 1] = string.format('%.0f', tasks)
  return result
end
if own and barrier then parties = caller end
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
end
redis.register_function{function_name='stepbarrier_v4_waiter_read', callback=waiter_read, flags={'no-writes'}}
local function index_read(KEYS, ARGV)
-- KEYS[1] a job's sorted set (its targets or its barrier index); ARGV[1] the
-- first rank, ARGV[2] how many (at most MAX_INDEX_READ), lowest score first
-- Returns {skipped, member, score, ...}: the members of at most MAX_ARGUMENT
-- bytes, with their scores as stored; skipped counts the longer ones, which are
-- never sent (a role that may write the set may plant megabyte members)
local refusal = called(KEYS, ARGV, 'an index read', 1, 1, 2, 2)
if refusal then return refusal end
local first, count = whole(ARGV[1]), whole(ARGV[2])
if not first or not count or count > MAX_INDEX_READ then
  return refused('an index read takes a first rank and at most ' .. MAX_INDEX_READ .. ' members')
end
local result = {0}
if count == 0 then return result end
local found = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '+inf', 'WITHSCORES', 'LIMIT', first, count)
for i = 1, #found, 2 do
  if #found[i] > MAX_ARGUMENT then
    result[1] = result[1] + 1
  else
    result[#result + 1] = found[i]
    result[#result + 1] = found[i + 1]
  end
end
return result
end
redis.register_function{function_name='stepbarrier_v4_index_read', callback=index_read, flags={'no-writes'}}
local function waiter_leave(KEYS, ARGV)
-- KEYS[1] this waiter's registry hash, KEYS[2] targets zset; ARGV[1] waiter id
local refusal = called(KEYS, ARGV, 'a leave', 2, 2, 1, 1)
if refusal then return refusal end
redis.call('UNLINK', KEYS[1])
if redis.call('TYPE', KEYS[2]).ok == 'zset' then redis.call('ZREM', KEYS[2], ARGV[1]) end
return 1
end
redis.register_function{function_name='stepbarrier_v4_waiter_leave', callback=waiter_leave, flags={}}
local function may_write(KEYS, ARGV)
-- KEYS: the keys a caller means to write. Does nothing: Redis's ACL checks the
-- declared keys before running it, so it tells whether this user may write them.
-- At most MAX_WRITE_KEYS keys (the library checks one), and no argument.
local refusal = called(KEYS, ARGV, 'may_write', 1, MAX_WRITE_KEYS, 0, 0)
if refusal then return refusal end
return 1
end
redis.register_function{function_name='stepbarrier_v4_may_write', callback=may_write, flags={}}
local function barrier_arrive(KEYS, ARGV)
-- KEYS[1] the barrier's hash, KEYS[2] the job's barrier index (sorted set),
-- KEYS[3] the job's barrier epoch (hash: token, by)
-- ARGV[1] the barrier (its name, or name:run_id), ARGV[2] this task's id,
-- ARGV[3] parties (at most MAX_PARTIES), ARGV[4] key TTL (s), ARGV[5] barrier
-- channel, ARGV[6] 'PUBLISH' or 'SPUBLISH' (see PUBLISH_STEP), ARGV[7] run id
-- ('' for none), ARGV[8] most barriers the index keeps (at most
-- MAX_BARRIER_INDEX), ARGV[9] the epoch token the caller's
-- earlier arrival was recorded under ('' for none), ARGV[10..] at most
-- MAX_RESTORED pairs of a task id and its arrival time (ms): arrivals the caller
-- saw at this barrier that Redis lost, recorded again on their behalf
-- Records the arrivals (a re-arrival keeps the first time) and, if that makes
-- the barrier complete, marks it so and announces it (the announcement is a
-- hint: readers count the task fields). A barrier begun under another epoch
-- than the current one is stale and begins anew; with no epoch (the job's
-- first barrier, or one Redis lost) a new one begins, its token greater than
-- the barrier's and the caller's. A caller whose epoch a reset or the job's
-- finish ended is told so (status 2) and nothing is recorded. Returns
--   {status, now ms, arrived, parties, completed ms ('0' while open), repaired,
--    epoch token, restorable (1: the caller's arrivals of an earlier epoch may
--    be recorded in this one; 0: a reset began it, they are refused)}
-- status: 1 recorded (now or before), 0 the barrier has another number of
-- parties (nothing is recorded; the reply holds the stored number), 2 the
-- caller's epoch was ended by a reset or the job's finish (nothing is recorded;
-- a ninth field says 'reset' or 'finish')
-- Bounded: the arguments are checked first; then everything is read (the
-- barrier, the epoch, the task fields to record, and, only when the barrier may
-- be complete, its task fields to count), and only then written, so a call
-- ended by FUNCTION KILL while it reads has written nothing.
if #ARGV > 9 + 2 * MAX_RESTORED then
  return refused('an arrival records again at most ' .. MAX_RESTORED .. ' pairs of a task '
                 .. 'and its time, not ' .. math.floor((#ARGV - 9) / 2))
end
local refusal = called(KEYS, ARGV, 'an arrival', 3, 3, 9, 9 + 2 * MAX_RESTORED)
if refusal then return refusal end
if (#ARGV - 9) % 2 ~= 0 then
  return refused('arrivals to record come in pairs of task and time')
end
local task, parties = whole(ARGV[2]), whole(ARGV[3])
if task == nil or parties == nil or parties < 1 or task >= parties then
  return refused('the task id must be in 0..parties-1')
end
if parties > MAX_PARTIES then
  return refused('a barrier has at most ' .. MAX_PARTIES .. ' parties')
end
local member = ARGV[1]
if #member > 129 or not (string.match(member, '^[%w._-]+$')
                         or string.match(member, '^[%w._-]+:[%w._-]+$')) then
  return refused('malformed barrier name')
end
if not positive(ARGV[4]) or not publish_ok(ARGV[6]) or not whole(ARGV[8])
   or (ARGV[9] ~= '' and not whole(ARGV[9])) then
  return refused('an arrival takes a TTL, PUBLISH or SPUBLISH, a number of barriers and '
                 .. 'an epoch token')
end
if not run_id_ok(ARGV[7]) then return refused('malformed run id') end
for i = 10, #ARGV do
  if not whole(ARGV[i]) then
    return refused('arrivals to record are pairs of a task id and a time, whole numbers')
  end
end

-- Read: nothing is written until everything is known
local now = now_ms()
local now_text = string.format('%.0f', now)
local repaired = 0
-- only the barrier's own fields are read (HMGET, never HGETALL), and only from
-- a hash of at most MAX_FIELDS fields more than its parties: a larger one (or
-- one with an oversized value) is begun anew, as a malformed one is
local kind, fields, length = read_hash(KEYS[1], BARRIER_FIELDS, MAX_FIELDS + MAX_PARTIES)
local stored, arrived, begun = nil, nil, nil
if kind == 'hash' then
  stored = barrier_parties(fields)
  arrived = whole(fields.arrived)
  begun = whole(fields.epoch)
  if stored and length > MAX_FIELDS + stored then kind, stored = 'oversized', nil end
end
-- the job's barrier epoch
local epoch, by = nil, nil
local epoch_kind, epoch_fields = read_hash(KEYS[3], EPOCH_FIELDS, MAX_FIELDS)
if epoch_kind == 'hash' then
  epoch = whole(epoch_fields.token)
  by = epoch_fields.by
elseif epoch_kind ~= 'none' then
  repaired = 1
end
local known = whole(ARGV[9])
local new_epoch = epoch == nil
if new_epoch then
  local clock = redis.call('TIME')
  epoch = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  for _, floor in ipairs({begun or 0, known or 0}) do
    if floor >= epoch and floor < MAX_STEP then epoch = floor + 1 end
  end
  by = 'arrival'
end
local token = string.format('%.0f', epoch)
if known and known ~= epoch and (by == 'reset' or by == 'finish') then
  -- the caller arrived in an epoch a reset or the job's finish ended: it is not a
  -- party of the next one (a rerun's barrier of the same name starts without it)
  redis.call('EXPIRE', KEYS[3], ARGV[4])
  return {2, now_text, '0', ARGV[3], '0', repaired, token, 0, by}
end
-- not a barrier as we write one (another type, oversized, or its counts are
-- gone), or one begun under another epoch (stale): it begins anew
local unlink = kind ~= 'none' and (stored == nil or arrived == nil or begun ~= epoch)
if unlink and (stored == nil or arrived == nil) then repaired = 1 end
local fresh = kind == 'none' or unlink
if not fresh and stored ~= parties then
  redis.call('EXPIRE', KEYS[3], ARGV[4])
  return {0, now_text, string.format('%.0f', arrived), string.format('%.0f', stored), '0',
          repaired, token, 1}
end
-- the barrier's own fields that are stored (the others are task fields)
local own = {parties = true, arrived = true, created_ms = true, run_id = true, epoch = true}
if not fresh then
  own = {}
  for name, _ in pairs(fields) do own[name] = true end
end
local restorable = 1
-- a party's remembered arrivals of an epoch that a reset or the job's finish
-- ended are not carried into the next one (Redis forgetting is another matter)
if known ~= epoch and (by == 'reset' or by == 'finish') then restorable = 0 end
-- the arrivals to record: each task once (the first time given), and only if
-- its field holds no arrival yet (a re-arrival keeps the first time)
local planned, order, absent = {}, {}, 0
local function plan(id, at)
  if planned[id] ~= nil then return end
  planned[id] = false
  local size = 0
  if not fresh then
    local field = 't' .. string.format('%.0f', id)
    size = redis.call('HSTRLEN', KEYS[1], field)
    if size > 0 and size <= MAX_TASK_VALUE and whole(redis.call('HGET', KEYS[1], field)) then
      return
    end
  end
  if size == 0 then absent = absent + 1 end
  planned[id] = at
  order[#order + 1] = id
end
plan(task, now)
if restorable == 1 then
  for i = 10, #ARGV, 2 do
    local id, at = whole(ARGV[i]), whole(ARGV[i + 1])
    if id < parties then plan(id, (at <= now) and at or now) end
  end
end
local added = #order
-- the arrivals, counted against the caller's parties (never the stored
-- 'parties', 'arrived' or 'completed_ms', which whoever may write the hash could
-- have set). HLEN less the barrier's own fields bounds them from above in O(1);
-- only once that bound reaches the parties are the task fields t0..t<parties-1>
-- themselves counted (a field that is no task's arrival completes nothing)
local count = added
if not fresh then
  local stored_own = 0
  for _, name in ipairs(BARRIER_FIELDS) do
    if own[name] then stored_own = stored_own + 1 end
  end
  count = length - stored_own + absent
  if count >= parties then
    count = added
    for first = 0, parties - 1, 1000 do
      local names = {}
      for id = first, math.min(first + 999, parties - 1) do
        local name = 't' .. string.format('%.0f', id)
        local size = redis.call('HSTRLEN', KEYS[1], name)
        if size > 0 and size <= MAX_TASK_VALUE then names[#names + 1] = name end
      end
      if #names > 0 then
        local values = redis.call('HMGET', KEYS[1], unpack(names))
        for i = 1, #names do
          if whole(values[i]) then count = count + 1 end
        end
      end
    end
  end
end
local complete = count >= parties
local completed = own.completed_ms and fields.completed_ms or nil
local stamped = (not fresh) and whole(completed) or nil

-- Write
if new_epoch then
  redis.call('UNLINK', KEYS[3])
  redis.call('HSET', KEYS[3], 'token', token, 'by', by)
end
redis.call('EXPIRE', KEYS[3], ARGV[4])
if unlink then redis.call('UNLINK', KEYS[1]) end
if fresh then
  redis.call('HSET', KEYS[1], 'parties', string.format('%.0f', parties), 'arrived', '0',
             'created_ms', now_text, 'run_id', ARGV[7], 'epoch', token)
  arrived = 0
end
local last = (own.last_ms and whole(fields.last_ms)) or 0
for _, id in ipairs(order) do
  local at = planned[id]
  redis.call('HSET', KEYS[1], 't' .. string.format('%.0f', id), string.format('%.0f', at))
  if at > last then last = at end
end
if added > 0 then
  redis.call('HSET', KEYS[1], 'last_ms', string.format('%.0f', last))
end
if count ~= arrived then
  arrived = count
  redis.call('HSET', KEYS[1], 'arrived', string.format('%.0f', count))
end
if complete and (added > 0 or not stamped or stamped == 0) then
  completed = now_text
  redis.call('HSET', KEYS[1], 'completed_ms', now_text)
  redis.call(publish_command(ARGV[6]), ARGV[5], '{"barrier":"' .. member .. '","complete":true}')
end
if not complete then completed = '0' end
redis.call('EXPIRE', KEYS[1], ARGV[4])
-- the index lets status show the open barriers without scanning the keyspace;
-- it forgets barriers whose keys have expired, and the oldest beyond ARGV[8]
-- (at most MAX_BARRIER_INDEX): each call removes at most about that many,
-- since an index of twice that or more (written by hand) is dropped whole
local most = math.min(whole(ARGV[8]), MAX_BARRIER_INDEX)
kind = redis.call('TYPE', KEYS[2]).ok
if kind ~= 'zset' and kind ~= 'none' then redis.call('UNLINK', KEYS[2]); repaired = 1 end
if kind == 'zset' and redis.call('ZCARD', KEYS[2]) >= 2 * MAX_BARRIER_INDEX then
  redis.call('UNLINK', KEYS[2]); repaired = 1
end
redis.call('ZADD', KEYS[2], now_text, member)
-- the pruning is the chief's: a range removal costs as much as the range, and a
-- worker user may not run one (it could on a sorted set it filled itself), so
-- for a worker the two calls are refused and skipped; the index stays below
-- 2 * MAX_BARRIER_INDEX all the same (dropped whole above)
local expired = string.format('%.0f', now - tonumber(ARGV[4]) * 1000)
pcall(redis.call, 'ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. expired)
pcall(redis.call, 'ZREMRANGEBYRANK', KEYS[2], 0, -most - 1)
redis.call('EXPIRE', KEYS[2], ARGV[4])
return {1, now_text, string.format('%.0f', arrived), string.format('%.0f', parties),
        completed, repaired, token, restorable}
end
redis.register_function{function_name='stepbarrier_v4_barrier_arrive', callback=barrier_arrive, flags={}}
local function report_progress(KEYS, ARGV)
-- KEYS[1] the job's progress hash; ARGV[1] the task id, ARGV[2] its step,
-- ARGV[3] the key's TTL (s)
-- Records the task's step as '<step>:<changed_ms>' in its field (the task id,
-- in decimal), changed_ms being the Redis time (ms) the task's step last
-- increased: a report of the same or a lower step (a restored checkpoint) keeps
-- the time of the last increase. Sets the hash's TTL. Returns the stored value.
-- Bounded: the arguments are checked first (a task id up to MAX_TASK_ID, a step
-- up to MAX_STEP, a TTL); a task not in the hash yet is refused when it holds
-- MAX_PROGRESS_TASKS fields already (HLEN, O(1)); the task's own value is read
-- only if it is at most MAX_PROGRESS_VALUE bytes (HSTRLEN first); a key of
-- another type is replaced (UNLINK). One HSET and one EXPIRE, whatever the hash holds.
local refusal = called(KEYS, ARGV, 'a progress report', 1, 1, 3, 3)
if refusal then return refusal end
local task, step = whole(ARGV[1]), whole(ARGV[2])
if task == nil or task > MAX_TASK_ID then
  return refused('the task id must be a whole number from 0 to ' .. MAX_TASK_ID)
end
if step == nil then
  return refused('the step must be a whole number from 0 to ' .. string.format('%.0f', MAX_STEP))
end
if not positive(ARGV[3]) then
  return refused('a progress report takes a TTL in seconds (a whole number of at least 1)')
end
local field = string.format('%.0f', task)
local now = now_ms()
local changed = now
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'hash' then
  local size = redis.call('HSTRLEN', KEYS[1], field)
  if size == 0 and redis.call('HLEN', KEYS[1]) >= MAX_PROGRESS_TASKS then
    return refused('the job\'s progress holds ' .. MAX_PROGRESS_TASKS .. ' tasks already: '
                   .. 'task ' .. field .. ' is not recorded')
  end
  if size > 0 and size <= MAX_PROGRESS_VALUE then
    local stored = redis.call('HGET', KEYS[1], field)
    local old_step, old_ms = string.match(stored, '^(%d+):(%d+)$')
    old_step, old_ms = whole(old_step), whole(old_ms)
    -- the time is kept unless the step increased (and a time from the future,
    -- a clock gone back or a hand-written value, is not kept)
    if old_step and old_ms and step <= old_step and old_ms <= now then changed = old_ms end
  end
elseif kind ~= 'none' then
  redis.call('UNLINK', KEYS[1])
end
local value = string.format('%.0f', step) .. ':' .. string.format('%.0f', changed)
redis.call('HSET', KEYS[1], field, value)
redis.call('EXPIRE', KEYS[1], ARGV[3])
return value
end
redis.register_function{function_name='stepbarrier_v4_report_progress', callback=report_progress, flags={}}
local function job_index(KEYS, ARGV)
-- KEYS[1] a team's job index (keys.job_index: a zset of job names, each scored
-- with the Redis time, in ms, until which its chief keeps it)
-- ARGV[1] the job, ARGV[2] seconds the entry lives unless its chief says it again
-- Adds or refreshes the job, then keeps the index bounded whatever the team's
-- users planted: anything but a zset there is replaced; one of more than twice
-- MAX_JOB_INDEX entries is dropped whole (UNLINK frees it off the main thread;
-- every chief puts its job back at its next refresh); the expired entries go,
-- then the ones that expire first beyond MAX_JOB_INDEX. So a call removes at
-- most 2 * MAX_JOB_INDEX members and copies none of them (a member may be large).
local refusal = called(KEYS, ARGV, 'a job index entry', 1, 1, 2, 2)
if refusal then return refusal end
local lifetime = positive(ARGV[2])
if not lifetime or lifetime > MAX_LIFETIME or #ARGV[1] == 0 or not run_id_ok(ARGV[1]) then
  -- (a job name is a run id's characters, 1 to 64 of them)
  return refused('a job index entry takes a job name and a lifetime of at most ' .. MAX_LIFETIME ..
                 ' seconds')
end
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'zset' and kind ~= 'none' then redis.call('UNLINK', KEYS[1]) end
if kind == 'zset' and redis.call('ZCARD', KEYS[1]) > 2 * MAX_JOB_INDEX then
  redis.call('UNLINK', KEYS[1])
end
local now = now_ms()
redis.call('ZADD', KEYS[1], now + lifetime * 1000, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
local size = redis.call('ZCARD', KEYS[1])
if size > MAX_JOB_INDEX then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, size - MAX_JOB_INDEX - 1)
end
-- the index lives as long as the longest lifetime a chief gave it (NX: a new
-- index, GT: a longer one), so a finished job's shorter one never cuts it short
redis.call('EXPIRE', KEYS[1], lifetime, 'NX')
redis.call('EXPIRE', KEYS[1], lifetime, 'GT')
return 1
end
redis.register_function{function_name='stepbarrier_v4_job_index', callback=job_index, flags={}}
redis.register_function{function_name='stepbarrier_v4_version', callback=function() return 4 end, flags={'no-writes'}}
