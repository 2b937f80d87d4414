"""The protocol, as data (docs/protocol.md): key names, payloads and their untrusted
reading, the Functions library's Lua and calls, freshness rules and ACL roles.
Nothing here imports redis-py or does I/O.
"""
