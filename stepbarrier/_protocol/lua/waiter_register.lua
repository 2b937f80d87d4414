
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
