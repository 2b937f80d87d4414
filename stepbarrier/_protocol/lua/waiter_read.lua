
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
