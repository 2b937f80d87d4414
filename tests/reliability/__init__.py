"""Fault-injection scenarios: real redis-server processes, real chief and worker processes.

Each scenario breaks something (Redis, a connection, the network, the chief, the
master under Sentinel) while workers wait, and checks from the JSON records the
processes leave behind that no release was lost, none came early, the chief's
training loop never blocked, and how long recovery took.
"""
