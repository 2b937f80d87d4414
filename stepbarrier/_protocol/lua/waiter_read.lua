
-- KEYS[1] a hash: the job's state, or a named barrier (a key under
-- stepbarrier:{JOB}:barrier:, the epoch included), KEYS[2] reset marker (read
-- only: FCALL_RO, no write permission needed); ARGV[1] (optional) 'wait': a
-- waiter's read of the state, which reads only the fields a wait decides by
-- (WAIT_FIELDS) and not the clock (now_ms '0')
-- Returns the Redis time, the reset marker and the hash:
--   {now_ms, reset marker or false, kind, field/value pairs...}
-- Only known fields are read: a state's STATE_FIELDS (a wait's: WAIT_FIELDS); a barrier's BARRIER_FIELDS
-- and EPOCH_FIELDS, then t0 .. t<parties - 1> of a barrier with valid parties.
-- kind is the key's type, or 'oversized' (nothing of it read): a hash of more
-- than MAX_FIELDS fields (a barrier: MAX_FIELDS + its parties), or a known
-- field longer than MAX_VALUE bytes (a task's: MAX_TASK_VALUE). A marker longer
-- than MAX_MARKER reads as 'oversized'. Its one loop, over a barrier's task
-- fields (at most MAX_PARTIES), only reads: FUNCTION KILL can end it.
local refusal = called(KEYS, ARGV, 'a read', 2, 2, 0, 1)
if refusal then return refusal end
if ARGV[1] ~= nil and ARGV[1] ~= 'wait' then return refused("a read takes no argument or 'wait'") end
local wait = ARGV[1] == 'wait'
local result = {wait and '0' or string.format('%.0f', now_ms())}
local marker = short_string(KEYS[2], MAX_MARKER)
if marker == false then marker = 'oversized' elseif marker == nil then marker = false end
result[2] = marker
local barrier = string.find(KEYS[1], '}:barrier:', 1, true) ~= nil
local names = wait and WAIT_FIELDS or STATE_FIELDS
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
