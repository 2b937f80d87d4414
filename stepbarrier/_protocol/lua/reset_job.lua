
-- KEYS[1] state, KEYS[2] targets, KEYS[3] registrations, KEYS[4] reset marker,
-- KEYS[5] barrier index, KEYS[6] barrier epoch, KEYS[7..] waiter registry keys
-- (and the barrier hashes the index names, deleted only to tidy up): at most
-- MAX_RESET_KEYS of those, else nothing is done (so the call is short however
-- many keys a job has: `stepbarrier reset` deletes the other entries beforehand,
-- and the new epoch makes every barrier stale, named here or not);
-- ARGV[1] channel, ARGV[2] marker TTL (s), ARGV[3] 'PUBLISH' or 'SPUBLISH' (see
-- PUBLISH_STEP), ARGV[4] barrier channel
-- Deletes the job's keys (UNLINK: a large key's memory is freed off the main
-- thread), leaves a new marker (a token: the Redis time in ms of the reset,
-- made greater than the one before) so that waiters who missed the
-- announcement still abort and chiefs begun before it stop, and announces it
-- on both channels. A new barrier epoch makes every barrier begun before the
-- reset stale at once, whatever the index names (see BARRIER_ARRIVE). Returns
-- the marker.
if #KEYS < 6 or #KEYS > 6 + MAX_RESET_KEYS then
  return refused('a reset names its 6 keys and at most ' .. MAX_RESET_KEYS ..
                 ' waiter entries and barriers')
end
local refusal = called(KEYS, ARGV, 'a reset', 6, 6 + MAX_RESET_KEYS, 3, 4)
if refusal then return refusal end
if not positive(ARGV[2]) or not publish_ok(ARGV[3]) then
  return refused('a reset takes a channel, a TTL, PUBLISH or SPUBLISH and a channel')
end
local epoch_clock = redis.call('TIME')
local epoch = tonumber(epoch_clock[1]) * 1000000 + tonumber(epoch_clock[2])
local epoch_kind, epoch_fields = read_hash(KEYS[6], EPOCH_FIELDS, MAX_FIELDS)
if epoch_kind == 'hash' then
  epoch = above(epoch, whole(epoch_fields.token))
end
for i = 5, #KEYS do redis.call('UNLINK', KEYS[i]) end
redis.call('HSET', KEYS[6], 'token', string.format('%.0f', epoch), 'by', 'reset')
redis.call('EXPIRE', KEYS[6], ARGV[2])
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3])
local now = redis.call('TIME')
local marker = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
-- the marker is a token (its value is also the reset's time, for operators):
-- it must differ from the one before, even for two resets in one millisecond
-- (a stored MAX_STEP leaves no room above it: the marker is then the time, which
-- differs from it all the same)
marker = above(marker, whole(short_string(KEYS[4], MAX_MARKER)))
local now_ms = string.format('%.0f', marker)
redis.call('SET', KEYS[4], now_ms, 'EX', ARGV[2])
local notice = '{"reset":true,"time_ms":' .. now_ms .. '}'
redis.call(publish_command(ARGV[3]), ARGV[1], notice)
if ARGV[4] then redis.call(publish_command(ARGV[3]), ARGV[4], notice) end
return now_ms
