
-- KEYS: the keys a caller means to write. Does nothing: Redis's ACL checks the
-- declared keys before running it, so it tells whether this user may write them.
-- At most MAX_WRITE_KEYS keys (the library checks one), and no argument.
local refusal = called(KEYS, ARGV, 'may_write', 1, MAX_WRITE_KEYS, 0, 0)
if refusal then return refusal end
return 1
