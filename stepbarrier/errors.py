"""Exceptions raised by stepbarrier (the tree: docs/python-api.md#errors).

Every error derives from one root, and each leaf also inherits the matching
builtin (``ValueError``, ``TimeoutError``, ``ConnectionError``) so that callers who
do not know stepbarrier can still catch it. The errors that end a wait carry its
context: ``target`` (the step waited for), ``last_step`` (the chief's last step
seen, ``None`` if none) and ``heartbeat_age`` (seconds since the chief's last
heartbeat, when known). Messages never contain a password: URLs are masked before
they are formatted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypeAlias, TypedDict

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from 3.11; only the checker reads it

TimeoutLimit: TypeAlias = Literal["deadline", "stall", "progress"]
"""Which limit ended a wait: ``BarrierTimeout.limit``."""
RefusalKind: TypeAlias = Literal["authentication", "permission", "tls", "response", "functions"]
"""What Redis refused: ``RedisRefused.kind``."""


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


class WaitContext(TypedDict, total=False):
    """The keywords of a wait's context, which every error that ends a wait takes."""

    job: str | None
    target: int | None
    last_step: int | None
    heartbeat_age: float | None


class _WaitError(StepBarrierError):
    """Shared context of errors that end a wait (see the module's docstring)."""

    def __init__(self, message: str, **context: Unpack[WaitContext]) -> None:
        super().__init__(message, job=context.get("job"))
        self.target = context.get("target")
        self.last_step = context.get("last_step")
        self.heartbeat_age = context.get("heartbeat_age")


class BarrierTimeout(_WaitError, TimeoutError):
    """The wait passed its overall timeout, or the chief stopped heart-beating.

    Attributes:
        stalled: True when the stall timeout (no chief heartbeat; at a named
            barrier, no new arrival) or the progress timeout ended the wait.
        limit: ``"deadline"`` (the overall timeout), ``"stall"``, or ``"progress"``
            (the chief's step did not move for ``STEPBARRIER_PROGRESS_TIMEOUT``);
            by default ``"stall"`` if ``stalled``, else ``"deadline"``.
        barrier: The named barrier waited at (``stepbarrier.Barrier``), else ``None``.
        missing: At a named barrier, the sorted ids of the tasks that never arrived.
    """

    def __init__(
        self,
        message: str,
        *,
        stalled: bool = False,
        barrier: str | None = None,
        missing: tuple[int, ...] = (),
        limit: TimeoutLimit | None = None,
        **context: Unpack[WaitContext],
    ) -> None:
        super().__init__(message, **context)
        self.stalled = stalled
        self.limit: TimeoutLimit = limit or ("stall" if stalled else "deadline")
        self.barrier = barrier
        self.missing = tuple(missing)


class BarrierAborted(_WaitError):
    """The job finished or was reset before the awaited step came.

    Attributes:
        reason: ``"done"`` or ``"reset"``.
        barrier: The named barrier waited at (aborted by a reset), else ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str = "done",
        barrier: str | None = None,
        **context: Unpack[WaitContext],
    ) -> None:
        super().__init__(message, **context)
        self.reason = reason
        self.barrier = barrier


class RedisUnavailable(_WaitError, ConnectionError):
    """Redis could not be reached within the caller's deadline, despite retries."""


class RedisRefused(StepBarrierError):
    """Redis answered but refused the operation: raised at once, as retrying cannot help.

    Attributes:
        kind: The credentials (``"authentication"``), an ACL permission
            (``"permission"``), the TLS handshake (``"tls"``), a command such as one
            on a key of the wrong type (``"response"``), or stepbarrier's Lua
            Functions, missing and not loadable by this user (``"functions"``).
    """

    def __init__(self, message: str, *, kind: RefusalKind, job: str | None = None) -> None:
        super().__init__(message, job=job)
        self.kind = kind
