"""What operators read and do: a job's status, its waiters, every job, resets.

``status`` (``read_status``), ``registry`` (the waiters' entries through the
index), ``summary`` (a large job's waiters in numbers), ``listing`` (every job
of a Redis), ``live_chief`` (whether a chief still heartbeats) and ``reset``.
"""
