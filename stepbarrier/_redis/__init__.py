"""Redis as the protocol uses it: the only package that talks to redis-py.

``client`` and ``aio_client`` (threaded and asyncio clients from a
``BarrierConfig``: URL, TLS, Cluster, Sentinel), ``failures`` (how a failed
call is judged and explained), ``retries`` (transient failures, within the
caller's deadline), ``bounded`` (calls bounded by their caller's time, on
connections of their own: a wait ends within its limits against a Redis that
hangs), ``functions`` (the Functions library in Redis, and the runner of its
calls) and ``subscription`` (a confirmed subscription).
"""
