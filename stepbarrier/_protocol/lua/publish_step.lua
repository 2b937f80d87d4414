
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
