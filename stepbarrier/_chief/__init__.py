"""The chief's side: hand the step over, and let threads write it to Redis.

``publisher`` (``StepPublisher``), ``threads`` (the writer and heartbeat
threads), ``state`` (what the chief's writes mean: its generation, the steps
waited for, its end), ``publish_call`` (one call of ``publish_step`` and its
reply) and ``registrations`` (the chief's ear for new waiters).
"""
