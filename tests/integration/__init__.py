"""The library and the ``stepbarrier`` command against a real redis-server.

Publisher, waiter, barriers, status, CLI, exporter, ACL rules, the demo: each
module starts the servers and processes it needs (see tests/redis_harness.py).
"""
