
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
