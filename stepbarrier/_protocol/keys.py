"""Names of a job's Redis keys and channel.

All of a job's keys share the hash tag ``{job}``, so in Redis Cluster they live
in one slot and a Lua script may touch them together. docs/design.md#keys
documents each one for operators.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "stepbarrier"


@dataclass(frozen=True)
class JobKeys:
    """The key and channel names of one job.

    Attributes:
        state: Hash: ``step``, ``generation``, ``done``, ``heartbeat_ms``, ``chief``.
        targets: Sorted set: waiter id -> the step it waits for (guides the chief).
        registrations: List the chief blocks on to hear of new waiters at once.
        reset: String: Redis time (ms) of the last ``reset``; removed by a new chief.
        waiter_prefix: Prefix of the per-waiter registry hashes.
        channel: Pub/sub channel carrying step announcements (JSON).
        barrier_index: Sorted set: every barrier of the job (``name`` or
            ``name:run_id``) -> Redis time (ms) of its last arrival.
        barrier_prefix: Prefix of the barrier hashes (``stepbarrier._barriers.barrier``).
        barrier_channel: Pub/sub channel carrying barrier completions and resets.
        barrier_epoch: Hash: ``token``, the job's current barrier epoch (a
            unique Redis time in microseconds), and ``by`` (``arrival`` or
            ``reset``: what began it). A barrier holds the token current when it
            was begun; one holding another (or any, once the epoch is gone) is
            stale and begins anew at the next arrival. Its name lies under the
            barrier prefix (``@`` is no barrier name's) so that every role's
            barrier key rights cover it.
        progress: Hash: task id (decimal) -> ``step:changed_ms``, each training
            task's own step as it last reported it (``ProgressReporter``), and
            the Redis time (ms) that step last increased (docs/protocol.md#progress).
    """

    job: str
    state: str
    targets: str
    registrations: str
    reset: str
    waiter_prefix: str
    channel: str
    barrier_index: str
    barrier_prefix: str
    barrier_channel: str
    barrier_epoch: str
    progress: str

    @classmethod
    def for_job(cls, job: str) -> JobKeys:
        """Key names for ``job`` (which must already be validated)."""
        base = f"{PREFIX}:{{{job}}}"
        return cls(
            job=job,
            state=f"{base}:state",
            targets=f"{base}:targets",
            registrations=f"{base}:registrations",
            reset=f"{base}:reset",
            waiter_prefix=f"{base}:waiter:",
            channel=f"{base}:steps",
            barrier_index=f"{base}:barrier-index",
            barrier_prefix=f"{base}:barrier:",
            progress=f"{base}:progress",
            barrier_channel=f"{base}:barriers",
            barrier_epoch=f"{base}:barrier:@epoch",
        )

    def waiter(self, waiter_id: str) -> str:
        """The registry key of one waiter."""
        return f"{self.waiter_prefix}{waiter_id}"

    @property
    def waiter_pattern(self) -> str:
        """Glob pattern matching every waiter entry of the job (for redis-cli; the
        library finds waiters through the targets index, never by scanning)."""
        return f"{self.waiter_prefix}*"

    def barrier(self, member: str) -> str:
        """The hash of one barrier (``member``: its name, or ``name:run_id``)."""
        return f"{self.barrier_prefix}{member}"

    @property
    def barrier_pattern(self) -> str:
        """Glob pattern matching every barrier hash of the job."""
        return f"{self.barrier_prefix}*"

    def all_fixed(self) -> tuple[str, ...]:
        """The job's keys other than the per-waiter entries."""
        return (self.state, self.targets, self.registrations, self.reset)
