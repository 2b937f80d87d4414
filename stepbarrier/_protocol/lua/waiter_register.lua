
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
