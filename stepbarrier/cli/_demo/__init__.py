"""``stepbarrier demo``: a real local job, and the processes that run it."""
