"""What operators read and do: a job's status, its waiters, every job, resets.

``status`` (``read_status``, and the one chief-liveness rule of every view and of
``publish``'s refusal), ``registry`` (the waiters' entries through the index),
``progress`` (each task's step), ``summary`` (a large job's waiters in numbers),
``listing`` (every job of a Redis, by the one bounded ``SCAN`` loop), ``missing``
and ``reset``.

The bounded-read rule of every module here: whoever holds a worker's (or the
chief's) password may write any of a job's keys by hand, at any size, so every
read and every reset is bounded work whatever the keys hold (sizes by ``HLEN``,
``HSTRLEN``, ``ZCARD`` before values; ranges by ``LIMIT``), and what is
malformed or oversized is a line in ``problems``, never an exception. A Redis
busy with a script (BUSY) fails the read: retried, then said as such.
"""
