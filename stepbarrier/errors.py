"""Exceptions raised by stepbarrier.

Every error derives from one root, and each leaf also inherits the matching
builtin so that callers who do not know stepbarrier can still catch it:

```text
StepBarrierError
├── ConfigurationError   (also ValueError)   a setting or argument is invalid
├── BarrierTimeout       (also TimeoutError) the overall or stall timeout passed
│                                            (at a named barrier: .missing tasks)
├── BarrierAborted                           the job finished or was reset first
├── RedisUnavailable     (also ConnectionError) Redis unreachable after retries
└── RedisRefused                             Redis answered but refused us
                                             (authentication, ACL, wrong type)
```

Messages never contain a password: URLs are masked before they are formatted.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

TimeoutLimit: TypeAlias = Literal["deadline", "stall", "progress"]
"""Which limit ended a wait (``BarrierTimeout.limit``): the overall timeout
(``"deadline"``), the stall timeout (``"stall"``: no write of the chief, or at
a named barrier no new arrival, observed for that long) or the progress timeout
(``"progress"``: the chief's step did not move, ``STEPBARRIER_PROGRESS_TIMEOUT``)."""

RefusalKind: TypeAlias = Literal["authentication", "permission", "tls", "response", "functions"]
"""What Redis refused (``RedisRefused.kind``): the credentials, an ACL permission,
the TLS handshake, a command (e.g. a key of the wrong type), or stepbarrier's
Lua Functions (missing and not loadable by this user, or no Functions at all)."""


class StepBarrierError(Exception):
    """Root of every error stepbarrier raises.

    Attributes:
        job: The job name the error concerns, when known.
    """

    def __init__(self, message: str, *, job: str | None = None) -> None:
        super().__init__(message)
        self.job = job


class ConfigurationError(StepBarrierError, ValueError):
    """A setting (environment variable or argument) has an invalid value.

    Attributes:
        variable: The environment variable or argument at fault, when known.
    """

    def __init__(
        self, message: str, *, variable: str | None = None, job: str | None = None
    ) -> None:
        super().__init__(message, job=job)
        self.variable = variable


class _WaitError(StepBarrierError):
    """Shared context of errors that end a wait."""

    def __init__(
        self,
        message: str,
        *,
        job: str | None = None,
        target: int | None = None,
        last_step: int | None = None,
        heartbeat_age: float | None = None,
    ) -> None:
        super().__init__(message, job=job)
        self.target = target
        self.last_step = last_step
        self.heartbeat_age = heartbeat_age


class BarrierTimeout(_WaitError, TimeoutError):
    """The wait passed its overall timeout, or the chief stopped heart-beating.

    Attributes:
        target: The step that was waited for.
        last_step: The last step seen from the chief (``None`` if none was seen).
        heartbeat_age: Seconds since the chief's last heartbeat, when known.
        stalled: True when the stall timeout (no chief heartbeat; at a named
            barrier, no new arrival) ended the wait.
        limit: Which limit ended it: ``"deadline"`` (the overall timeout),
            ``"stall"`` or ``"progress"`` (the progress timeout; ``stalled``
            is then True too). Without one given, ``"stall"`` if ``stalled``,
            else ``"deadline"``.
        barrier: The named barrier waited at (``stepbarrier.Barrier``), else ``None``.
        missing: At a named barrier, the sorted ids of the tasks that never
            arrived (the message names them too); ``()`` for a step wait.
    """

    def __init__(
        self,
        message: str,
        *,
        job: str | None = None,
        target: int | None = None,
        last_step: int | None = None,
        heartbeat_age: float | None = None,
        stalled: bool = False,
        barrier: str | None = None,
        missing: tuple[int, ...] = (),
        limit: TimeoutLimit | None = None,
    ) -> None:
        super().__init__(
            message,
            job=job,
            target=target,
            last_step=last_step,
            heartbeat_age=heartbeat_age,
        )
        self.stalled = stalled
        self.limit: TimeoutLimit = limit or ("stall" if stalled else "deadline")
        self.barrier = barrier
        self.missing = tuple(missing)


class BarrierAborted(_WaitError):
    """The job finished or was reset before the awaited step came.

    Attributes:
        target: The step that was waited for.
        last_step: The chief's last step (``None`` if none was seen).
        reason: ``"done"`` or ``"reset"``.
        barrier: The named barrier waited at (aborted by a reset), else ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        job: str | None = None,
        target: int | None = None,
        last_step: int | None = None,
        heartbeat_age: float | None = None,
        reason: str = "done",
        barrier: str | None = None,
    ) -> None:
        super().__init__(
            message,
            job=job,
            target=target,
            last_step=last_step,
            heartbeat_age=heartbeat_age,
        )
        self.reason = reason
        self.barrier = barrier


class RedisUnavailable(_WaitError, ConnectionError):
    """Redis could not be reached within the caller's deadline, despite retries."""


class RedisRefused(StepBarrierError):
    """Redis answered but refused the operation: wrong password, unknown user,
    missing ACL permission, a TLS certificate that does not verify, or a key of
    the wrong type. Retrying cannot help, so it is raised at once.

    Attributes:
        kind: ``"authentication"``, ``"permission"``, ``"tls"``, ``"response"`` or
            ``"functions"`` (see ``RefusalKind``).
    """

    def __init__(self, message: str, *, kind: RefusalKind, job: str | None = None) -> None:
        super().__init__(message, job=job)
        self.kind = kind
