
-- KEYS: the keys a caller means to write. Does nothing: Redis's ACL checks the
-- declared keys before running it, so it tells whether this user may write them.
return 1
