"""Redis as the protocol uses it: the only package that talks to redis-py (its modules:
docs/design.md#package-layout).
"""
