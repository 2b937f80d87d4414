
-- KEYS[1] a job's sorted set (its targets or its barrier index); ARGV[1] the
-- first rank, ARGV[2] how many (at most MAX_INDEX_READ), lowest score first
-- Returns {skipped, member, score, ...}: the members of at most MAX_ARGUMENT
-- bytes, with their scores as stored; skipped counts the longer ones, which are
-- never sent (a role that may write the set may plant megabyte members)
local refusal = called(KEYS, ARGV, 'an index read', 1, 1, 2, 2)
if refusal then return refusal end
local first, count = whole(ARGV[1]), whole(ARGV[2])
if not first or not count or count > MAX_INDEX_READ then
  return refused('an index read takes a first rank and at most ' .. MAX_INDEX_READ .. ' members')
end
local result = {0}
if count == 0 then return result end
local found = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '+inf', 'WITHSCORES', 'LIMIT', first, count)
for i = 1, #found, 2 do
  if #found[i] > MAX_ARGUMENT then
    result[1] = result[1] + 1
  else
    result[#result + 1] = found[i]
    result[#result + 1] = found[i + 1]
  end
end
return result
