
local function whole(text)
  -- One definition of a stored number, the same as Python's wire.parse_int:
  -- 1 to 16 ASCII digits (no sign, space, exponent or hex), at most MAX_STEP
  -- (2^53 - 2, so that n + 1 is exact in doubles); a larger one is malformed (nil).
  if type(text) ~= 'string' or #text > 16 or not string.match(text, '^%d+$') then return nil end
  local n = tonumber(text)
  if n and n <= MAX_STEP then return n end
  return nil
end
local function above(number, stored)
  -- `number` raised to stored + 1 if `stored` (a whole number, or nil) is not
  -- below it: so a new generation, epoch or marker is above what is stored, and
  -- at most MAX_STEP. A stored MAX_STEP leaves no valid number above it: it is
  -- passed over (to its caller, malformed), and `number` is returned as it is
  if stored and stored >= number and stored < MAX_STEP then return stored + 1 end
  return number
end
local function at_limit(...)
  -- true if one of these stored texts is MAX_STEP: nothing can be numbered above
  -- it, so whoever must (a begin, above a stored generation, fence or begun)
  -- treats it as malformed
  for i = 1, select('#', ...) do
    if whole((select(i, ...))) == MAX_STEP then return true end
  end
  return false
end
local function publish_command(name)
  -- announcements go out plain, or sharded on a Redis Cluster; nothing else
  if name == 'SPUBLISH' then return 'SPUBLISH' end
  return 'PUBLISH'
end
local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
local function short_string(key, limit)
  -- a string key's value if it has at most `limit` bytes; nil: no string there;
  -- false: a longer one (never read: STRLEN is O(1), GET copies)
  if redis.call('TYPE', key).ok ~= 'string' then return nil end
  if redis.call('STRLEN', key) > limit then return false end
  return redis.call('GET', key)
end
local function compact(key)
  -- true if the hash is a listpack (ziplist before Redis 7): Redis keeps one only
  -- while every value is at most hash-max-listpack-value bytes, which the
  -- operator keeps at most MAX_ARGUMENT (docs/protocol.md#bounds), so HMGET of
  -- it copies no more than the arguments could. false for anything else, and
  -- under a users.acl without +object|encoding (the per-field checks then)
  local ok, encoding = pcall(redis.call, 'OBJECT', 'ENCODING', key)
  return ok and (encoding == 'listpack' or encoding == 'listpackex' or encoding == 'ziplist')
end
local function field_values(key, names, limit)
  -- HMGET of `names` (false: absent), or nil if one of them is longer than `limit`
  -- bytes: O(#names), whatever else the hash holds. A compact hash is read at
  -- once and its values measured here; another has each value's length asked
  -- first (HSTRLEN), so that no large value is ever copied
  if compact(key) then
    local values = redis.call('HMGET', key, unpack(names))
    for i = 1, #names do
      if values[i] and #values[i] > limit then return nil end
    end
    return values
  end
  for i = 1, #names do
    if redis.call('HSTRLEN', key, names[i]) > limit then return nil end
  end
  return redis.call('HMGET', key, unpack(names))
end
local function read_hash(key, names, max_fields)
  -- kind, fields (name -> value), length. kind: the key's type, or 'oversized'
  -- (more than max_fields fields, or a value of `names` over MAX_VALUE bytes):
  -- then nothing of it is read. HLEN first: it answers for a hash and for no key
  -- (0: a hash has at least one field); TYPE only when it refused another type
  local ok, length = pcall(redis.call, 'HLEN', key)
  if not ok then
    local kind = redis.call('TYPE', key).ok
    -- a hash whose HLEN was refused (not by its type): the refusal is the call's
    if kind == 'hash' then error(length) end
    return kind, {}, 0
  end
  if length == 0 then return 'none', {}, 0 end
  if length > max_fields then return 'oversized', {}, length end
  local values = field_values(key, names, MAX_VALUE)
  if values == nil then return 'oversized', {}, length end
  local fields = {}
  for i = 1, #names do
    if values[i] then fields[names[i]] = values[i] end
  end
  return 'hash', fields, length
end
local function barrier_parties(fields)
  local parties = whole(fields.parties)
  if parties and parties >= 1 and parties <= MAX_PARTIES then return parties end
  return nil
end
local function refused(message)
  -- the library's refusal of a call, in its one style (ERR stepbarrier: ...)
  return redis.error_reply('ERR stepbarrier: ' .. message)
end
local function count_text(low, high)
  if low == high then return tostring(low) end
  return low .. ' to ' .. high
end
local function called(keys, args, what, key_low, key_high, arg_low, arg_high)
  -- nil if a call names key_low..key_high keys and passes arg_low..arg_high
  -- arguments, none longer than MAX_ARGUMENT bytes; else the refusal to return.
  -- Every function checks this first, before it reads, writes or loops over
  -- anything: its loops over arguments are bounded by these counts (a key's
  -- name costs nothing but its hashing, so only the arguments' sizes count)
  if #keys < key_low or #keys > key_high or #args < arg_low or #args > arg_high then
    return refused(what .. ' names ' .. count_text(key_low, key_high) .. ' keys and takes ' ..
                   count_text(arg_low, arg_high) .. ' arguments, not ' .. #keys .. ' and ' ..
                   #args)
  end
  for i = 1, #args do
    if #args[i] > MAX_ARGUMENT then
      return refused(what .. ': argument ' .. i .. ' is longer than ' .. MAX_ARGUMENT .. ' bytes')
    end
  end
  return nil
end
local function positive(text)
  -- a whole number of at least 1 (a TTL), or nil
  local n = whole(text)
  if n and n >= 1 then return n end
  return nil
end
local function run_id_ok(text)
  -- a run id as Python validates it: at most 64 letters, digits, '.', '_' or '-'
  return #text <= 64 and string.match(text, '^[%w._-]*$') ~= nil
end
local function publish_ok(name)
  return name == 'PUBLISH' or name == 'SPUBLISH'
end
