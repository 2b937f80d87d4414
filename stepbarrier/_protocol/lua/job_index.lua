
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
