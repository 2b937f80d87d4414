"""Names of a job's Redis keys and channels (docs/design.md#keys documents each one).

All of a job's keys share the hash tag ``{job}``, so in Redis Cluster they live
in one slot and a function may touch them together.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "stepbarrier"


@dataclass(frozen=True)
class JobKeys:
    """The key and channel names of one job. ``barrier_epoch`` lies under the barrier
    prefix (``@`` is no barrier name's) so that every role's barrier key rights cover it."""

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
        """Glob pattern of the job's waiter entries (for ACLs and redis-cli: the
        library finds waiters through the targets index, never by scanning)."""
        return f"{self.waiter_prefix}*"

    def barrier(self, member: str) -> str:
        """The hash of one barrier (``member``: its name, or ``name:run_id``)."""
        return f"{self.barrier_prefix}{member}"

    def all_fixed(self) -> tuple[str, ...]:
        """The job's keys other than the per-waiter entries."""
        return (self.state, self.targets, self.registrations, self.reset)


def job_index(pattern: str) -> str:
    """The job index of the jobs ``pattern`` (validated): a sorted set of job names that
    the chiefs of those jobs keep (``STEPBARRIER_JOBS_PATTERN``) and listings read
    instead of walking the keyspace. Its name holds the pattern as it is written, so
    that the team's ACL rules (``~stepbarrier:{team-a-*}:jobs``) cover it and no other
    team's, and no job's key is ever named alike (a job name holds no ``*`` or ``?``).

    Example:
        >>> job_index("team-a-*")
        'stepbarrier:{team-a-*}:jobs'
    """
    return f"{PREFIX}:{{{pattern}}}:jobs"
