"""The protocol, as data: what travels through Redis and how it is read back.

``keys`` (the names of a job's keys and channels), ``wire`` (payloads and the
untrusted reading of what Redis holds), ``freshness`` (probation and the
confirmation window), ``lua`` (the Functions library's Lua, as ``.lua``
files), ``library`` and ``barrier_library`` (its pieces, limits and replies),
``calls`` (its long calls, built from named arguments), ``barrier_record`` (a
named barrier's hash, read back) and ``roles`` (the ACL rights of each role).
Nothing here imports redis-py or does I/O; docs/protocol.md specifies what
these modules implement.
"""
