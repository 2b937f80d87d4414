
-- KEYS[1] state hash, KEYS[2] reset marker; ARGV[1] the caller's run id ('' for none),
-- ARGV[2] the caller's floor: the highest generation it knows of ('0': none)
-- Returns a generation number above every one this job's state shows and the
-- caller knows of (the Redis clock in microseconds, or the stored generation,
-- fence or begun + 1, or the floor + 1, whichever is highest: the clock went
-- back, or two chiefs began in the same microsecond), records it as `begun`
-- (whoever's state it is: the new generation's first write then needs no
-- probation) and, on its own run's state or on none, as the state's fence, so
-- that an older generation's writes are refused from the begin on
-- (docs/protocol.md#generations),
-- and what the new chief must know before its first write:
--   {generation, reset marker ('' for none), stored run id, stored beat,
--    stored done (0/1), stored chief, stored generation ('0' for none)}
-- The reset marker is a token: the chief's writes carry it, and a write under
-- another marker is refused (docs/protocol.md#reset). A marker longer than
-- MAX_MARKER reads as 'oversized', and an oversized state (see read_hash) as
-- another type's key: no state, left alone (the next write replaces it).
local refusal = called(KEYS, ARGV, 'a begin', 2, 2, 1, 2)
if refusal then return refusal end
if not run_id_ok(ARGV[1]) then return refused('malformed run id') end
if ARGV[2] and ARGV[2] ~= '' and not whole(ARGV[2]) then
  return refused('the floor is a whole number')
end
local now = redis.call('TIME')
local generation = tonumber(now[1]) * 1000000 + tonumber(now[2])
generation = above(generation, whole(ARGV[2] or ''))
local run, beat, done, chief, stored = '', '0', '0', '', nil
local kind, state = read_hash(KEYS[1], STATE_FIELDS, MAX_FIELDS)
if kind == 'hash' and at_limit(state.generation, state.fence, state.begun) then
  -- no generation can be numbered above MAX_STEP (2^53 - 2 us is the year 2255:
  -- only a hand writes it): the hash is malformed, and goes, as a write would
  -- replace it; the begin then finds no state
  redis.call('UNLINK', KEYS[1])
  kind, state = 'none', {}
end
if kind == 'hash' then
  stored = whole(state.generation)
  if stored and whole(state.step) then
    generation = above(generation, stored)
    -- the new generation fences the older ones from now on, not only from its
    -- first write: a write of a generation below the fence is superseded
    generation = above(generation, whole(state.fence))
    generation = above(generation, whole(state.begun))
    run = state.run_id or ''
    -- only its own run's state: another run's chief is watched, not fenced
    -- (docs/protocol.md#runs)
    if run == (ARGV[1] or '') then
      redis.call('HSET', KEYS[1], 'fence', string.format('%.0f', generation))
    end
    redis.call('HSET', KEYS[1], 'begun', string.format('%.0f', generation))
    beat = state.beat or '0'
    done = state.done or '0'
    chief = state.chief or ''
  else
    stored = nil
  end
end
if stored == nil and (kind == 'none' or kind == 'hash') then
  -- no state: leave the fence alone, so that an older generation's first write
  -- (a chief that paused between its begin and it) is refused all the same
  generation = above(generation, whole(state.fence))
  generation = above(generation, whole(state.begun))
  redis.call('HSET', KEYS[1], 'fence', string.format('%.0f', generation),
             'begun', string.format('%.0f', generation))
  redis.call('EXPIRE', KEYS[1], 86400)
end
local marker = short_string(KEYS[2], MAX_MARKER)
if marker == false then marker = 'oversized' elseif marker == nil then marker = '' end
return {string.format('%.0f', generation), marker, string.sub(run, 1, 64),
        string.sub(beat, 1, 16), string.sub(done, 1, 1), string.sub(chief, 1, 200),
        stored and string.format('%.0f', stored) or '0'}
