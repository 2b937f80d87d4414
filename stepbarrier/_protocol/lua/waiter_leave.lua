
-- KEYS[1] this waiter's registry hash, KEYS[2] targets zset; ARGV[1] waiter id
local refusal = called(KEYS, ARGV, 'a leave', 2, 2, 1, 1)
if refusal then return refusal end
redis.call('UNLINK', KEYS[1])
if redis.call('TYPE', KEYS[2]).ok == 'zset' then redis.call('ZREM', KEYS[2], ARGV[1]) end
return 1
