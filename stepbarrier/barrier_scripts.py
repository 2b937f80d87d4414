"""The Lua code of a named barrier (``stepbarrier.barrier``).

Registered in ``scripts.BODIES`` with the rest of the library, so it runs as a
function of the Redis Functions library and uses its helpers (``whole``,
``now_ms``, ``publish_command``). A barrier is one hash under the job's hash
tag: ``parties``, ``arrived``, ``created_ms``, ``run_id``, ``last_ms``,
``completed_ms`` once complete, and ``t<task id>`` -> arrival time (ms) per task.
The job's barrier index (a sorted set) lets ``status`` and ``reset`` find them.
"""

from __future__ import annotations

BARRIER_RECORDED = 1
"""BARRIER_ARRIVE reply status: the arrival is recorded (now or before)."""
BARRIER_OTHER_PARTIES = 0
"""BARRIER_ARRIVE reply status: the barrier was begun with another number of parties."""

BARRIER_ARRIVE_BODY = """
-- KEYS[1] the barrier's hash, KEYS[2] the job's barrier index (sorted set)
-- ARGV[1] the barrier (its name, or name:run_id), ARGV[2] this task's id,
-- ARGV[3] parties, ARGV[4] key TTL (s), ARGV[5] barrier channel, ARGV[6]
-- 'PUBLISH' or 'SPUBLISH' (see PUBLISH_STEP), ARGV[7] run id ('' for none),
-- ARGV[8] most barriers the index keeps
-- Records the task's arrival (a re-arrival keeps the first time) and, if it is
-- the last one, marks the barrier complete and announces it. Returns
--   {status, now ms, arrived, parties, completed ms ('0' while open), repaired}
-- status: 1 recorded (now or before), 0 the barrier has another number of
-- parties (nothing is recorded; the reply holds the stored number)
local task, parties = whole(ARGV[2]), whole(ARGV[3])
if task == nil or parties == nil or parties < 1 or task >= parties then
  return redis.error_reply('ERR stepbarrier: the task id must be in 0..parties-1')
end
local member = ARGV[1]
if #member > 129 or not (string.match(member, '^[%w._-]+$')
                         or string.match(member, '^[%w._-]+:[%w._-]+$')) then
  return redis.error_reply('ERR stepbarrier: malformed barrier name')
end
local now = string.format('%.0f', now_ms())
local repaired = 0
local kind = redis.call('TYPE', KEYS[1]).ok
local stored, arrived = nil, nil
if kind == 'hash' then
  stored = whole(redis.call('HGET', KEYS[1], 'parties'))
  arrived = whole(redis.call('HGET', KEYS[1], 'arrived'))
end
if kind ~= 'none' and (stored == nil or arrived == nil) then
  -- not a barrier as we write one (another type, or its counts are gone): begin anew
  redis.call('DEL', KEYS[1]); repaired = 1; stored = nil
end
if stored == nil then
  redis.call('HSET', KEYS[1], 'parties', string.format('%.0f', parties), 'arrived', '0',
             'created_ms', now, 'run_id', ARGV[7])
  stored, arrived = parties, 0
elseif stored ~= parties then
  return {0, now, string.format('%.0f', arrived), string.format('%.0f', stored), '0', repaired}
end
local field = 't' .. string.format('%.0f', task)
if not redis.call('HGET', KEYS[1], field) then
  arrived = arrived + 1
  redis.call('HSET', KEYS[1], field, now, 'last_ms', now, 'arrived', string.format('%.0f', arrived))
end
local completed = redis.call('HGET', KEYS[1], 'completed_ms')
if not whole(completed) and arrived >= parties then
  completed = now
  redis.call('HSET', KEYS[1], 'completed_ms', now)
  redis.call(publish_command(ARGV[6]), ARGV[5], '{"barrier":"' .. member .. '","complete":true}')
end
redis.call('EXPIRE', KEYS[1], ARGV[4])
-- the index lets status and reset find the barriers without scanning the keyspace;
-- it forgets barriers whose keys have expired, and the oldest beyond ARGV[8]
kind = redis.call('TYPE', KEYS[2]).ok
if kind ~= 'zset' and kind ~= 'none' then redis.call('DEL', KEYS[2]); repaired = 1 end
redis.call('ZADD', KEYS[2], now, member)
local expired = string.format('%.0f', tonumber(now) - tonumber(ARGV[4]) * 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. expired)
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -tonumber(ARGV[8]) - 1)
redis.call('EXPIRE', KEYS[2], ARGV[4])
return {1, now, string.format('%.0f', arrived), string.format('%.0f', parties),
        whole(completed) and completed or '0', repaired}
"""
