
-- KEYS[1] the barrier's hash, KEYS[2] the job's barrier index (sorted set),
-- KEYS[3] the job's barrier epoch (hash: token, by)
-- ARGV[1] the barrier (its name, or name:run_id), ARGV[2] this task's id,
-- ARGV[3] parties (at most MAX_PARTIES), ARGV[4] key TTL (s), ARGV[5] barrier
-- channel, ARGV[6] 'PUBLISH' or 'SPUBLISH' (see PUBLISH_STEP), ARGV[7] run id
-- ('' for none), ARGV[8] most barriers the index keeps (at most
-- MAX_BARRIER_INDEX), ARGV[9] the epoch token the caller's
-- earlier arrival was recorded under ('' for none), ARGV[10..] pairs of a task
-- id and its arrival time (ms): arrivals the caller saw at this barrier that
-- Redis lost, recorded again on their behalf
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
local task, parties = whole(ARGV[2]), whole(ARGV[3])
if task == nil or parties == nil or parties < 1 or task >= parties then
  return redis.error_reply('ERR stepbarrier: the task id must be in 0..parties-1')
end
if parties > MAX_PARTIES then
  return redis.error_reply('ERR stepbarrier: a barrier has at most ' .. MAX_PARTIES .. ' parties')
end
local member = ARGV[1]
if #member > 129 or not (string.match(member, '^[%w._-]+$')
                         or string.match(member, '^[%w._-]+:[%w._-]+$')) then
  return redis.error_reply('ERR stepbarrier: malformed barrier name')
end
if #ARGV < 9 or (#ARGV - 9) % 2 ~= 0 then
  return redis.error_reply('ERR stepbarrier: arrivals to record come in pairs of task and time')
end
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
if epoch == nil then
  local clock = redis.call('TIME')
  epoch = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  for _, floor in ipairs({begun or 0, known or 0}) do
    if floor >= epoch and floor < MAX_STEP then epoch = floor + 1 end
  end
  by = 'arrival'
  redis.call('UNLINK', KEYS[3])
  redis.call('HSET', KEYS[3], 'token', string.format('%.0f', epoch), 'by', by)
end
redis.call('EXPIRE', KEYS[3], ARGV[4])
local token = string.format('%.0f', epoch)
if known and known ~= epoch and (by == 'reset' or by == 'finish') then
  -- the caller arrived in an epoch a reset or the job's finish ended: it is not a
  -- party of the next one (a rerun's barrier of the same name starts without it)
  return {2, now_text, '0', ARGV[3], '0', repaired, token, 0, by}
end
-- the barrier's own fields that are stored (the others are task fields)
local own = {}
if kind ~= 'none' and (stored == nil or arrived == nil or begun ~= epoch) then
  -- not a barrier as we write one (another type, oversized, or its counts are
  -- gone), or one begun under another epoch (stale): begin anew
  if stored == nil or arrived == nil then repaired = 1 end
  redis.call('UNLINK', KEYS[1]); stored = nil
elseif kind == 'hash' then
  for name, _ in pairs(fields) do own[name] = true end
end
if stored == nil then
  redis.call('HSET', KEYS[1], 'parties', string.format('%.0f', parties), 'arrived', '0',
             'created_ms', now_text, 'run_id', ARGV[7], 'epoch', token)
  stored, arrived = parties, 0
  own = {parties = true, arrived = true, created_ms = true, run_id = true, epoch = true}
elseif stored ~= parties then
  return {0, now_text, string.format('%.0f', arrived), string.format('%.0f', stored), '0',
          repaired, token, 1}
end
local restorable = 1
-- a party's remembered arrivals of an epoch that a reset or the job's finish
-- ended are not carried into the next one (Redis forgetting is another matter)
if known ~= epoch and (by == 'reset' or by == 'finish') then restorable = 0 end
local last = (own.last_ms and whole(fields.last_ms)) or 0
local added = 0
local function record(id, at)
  local field = 't' .. string.format('%.0f', id)
  local size = redis.call('HSTRLEN', KEYS[1], field)
  if size == 0 or size > MAX_TASK_VALUE or not whole(redis.call('HGET', KEYS[1], field)) then
    redis.call('HSET', KEYS[1], field, string.format('%.0f', at))
    added = added + 1
    if at > last then last = at end
  end
end
record(task, now)
if restorable == 1 then
  for i = 10, #ARGV, 2 do
    local id, at = whole(ARGV[i]), whole(ARGV[i + 1])
    if id and id < parties then record(id, (at and at <= now) and at or now) end
  end
end
if added > 0 then
  redis.call('HSET', KEYS[1], 'last_ms', string.format('%.0f', last))
  own.last_ms = true
end
-- the arrivals are counted, not taken from the 'arrived' counter (whoever may
-- write the hash could have set it): every field but the barrier's own is a
-- task's, and HLEN counts them in O(1). Only a hand-written field counts
-- wrongly, and whoever may write one may as well write a task field.
local stored_own = 0
for _, name in ipairs(BARRIER_FIELDS) do
  if own[name] then stored_own = stored_own + 1 end
end
local count = redis.call('HLEN', KEYS[1]) - stored_own
if count ~= arrived then
  arrived = count
  redis.call('HSET', KEYS[1], 'arrived', string.format('%.0f', count))
end
local complete = count >= parties
local completed = own.completed_ms and fields.completed_ms or nil
if complete and (added > 0 or not whole(completed)) then
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
local most = math.min(whole(ARGV[8]) or MAX_BARRIER_INDEX, MAX_BARRIER_INDEX)
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
