
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
