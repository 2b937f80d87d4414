"""What operators read and do: a job's status, its waiters, every job, resets.

``status`` (``read_status``, and the one chief-liveness rule of every view),
``registry`` (the waiters' entries through the index), ``progress`` (each task's
step), ``summary`` (a large job's waiters in numbers), ``listing`` (every job of a
Redis, by the one bounded ``SCAN`` loop), ``missing``, ``live_chief`` and ``reset``.
"""
