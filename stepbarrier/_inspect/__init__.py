"""What operators read and do: a job's status, its waiters, every job, resets.

The bounded-read rule of every module here: whoever holds a worker's (or the
chief's) password may write any of a job's keys by hand, at any size, so every
read and every reset is bounded work whatever the keys hold (sizes by ``HLEN``,
``HSTRLEN``, ``ZCARD`` before values; ranges by ``LIMIT``), and what is
malformed or oversized is a line in ``problems``, never an exception. A Redis
busy with a script (BUSY) fails the read: retried, then said as such.
"""
