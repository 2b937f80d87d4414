"""Retrying transient Redis failures (``is_transient``) with backoff, never past the
caller's deadline; any other is raised at once, translated (``translate``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from redis import exceptions as rex
from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential, wait_random
from tenacity.wait import wait_base

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._redis.failures import (
    REDIS_ERRORS,
    describe_redis,
    is_transient,
    one_line,
    translate,
)

# the name these messages always had: log filters and tests select by it
log = logging.getLogger("stepbarrier._redis.client")

T = TypeVar("T")

BACKOFF_INITIAL = 0.05
"""First retry delay in seconds; it doubles up to ``BACKOFF_MAX``."""
BACKOFF_MAX = 2.0
BACKOFF_JITTER = 0.25
"""Up to this many seconds of random delay added to each retry, so clients spread out."""


def backoff() -> wait_base:
    """Exponential backoff with jitter (``BACKOFF_*``)."""
    return wait_exponential(multiplier=BACKOFF_INITIAL, max=BACKOFF_MAX) + wait_random(
        0, BACKOFF_JITTER
    )


def call_with_retries(
    operation: Callable[[], T],
    config: BarrierConfig,
    *,
    action: str,
    deadline: float | None,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    quiet: bool = False,
) -> T:
    """Run ``operation``, retrying transient Redis errors until ``deadline``.

    Args:
        action: What the operation does, for messages ("read the job's state").
        deadline: ``clock()`` value at which the last try starts; ``None`` retries
            for as long as the errors are transient.
        quiet: Log the retries at DEBUG, not as WARNINGs: the caller says
            once what an outage means to it.

    Raises:
        RedisUnavailable: Still unreachable at the deadline.
        RedisRefused: A non-transient error, at once.
    """
    try:  # the first try without tenacity's machinery: most calls succeed at once
        return operation()
    except Exception as exc:
        first: Exception | None = exc

    def again() -> T:
        # tenacity's first try is the one that just failed: it judges that
        # failure (retry, log, sleep, stop) as if it had made the try itself
        nonlocal first
        if first is not None:
            failed, first = first, None
            raise failed
        return operation()

    settings = retry_settings(config, action=action, deadline=deadline, clock=clock, quiet=quiet)
    try:
        return Retrying(sleep=sleep, **settings)(again)
    except (*REDIS_ERRORS, OSError) as exc:  # OSError: a raw socket error redis-py did not wrap
        error = exc if isinstance(exc, REDIS_ERRORS) else rex.ConnectionError(str(exc))
        raise translate(error, config, action=action) from exc


def retry_settings(
    config: BarrierConfig,
    *,
    action: str,
    deadline: float | None,
    clock: Callable[[], float],
    quiet: bool = False,
) -> dict[str, Any]:
    """tenacity's settings for ``call_with_retries`` (and its asyncio twin) but ``sleep``:
    the last error is raised (``reraise``) for the caller to translate."""

    def note(state: RetryCallState) -> None:
        if state.attempt_number in (1, 10) or state.attempt_number % 50 == 0:
            error = state.outcome.exception() if state.outcome else None
            log.log(
                logging.DEBUG if quiet else logging.WARNING,
                "%s unavailable (%s); retrying to %s",
                describe_redis(config),
                one_line(error) if error else "?",
                action,
            )

    strategy = backoff()

    def wait(state: RetryCallState) -> float:
        # never sleep past the deadline, and never give up before it: the last try
        # starts at the deadline (Redis may be back by then)
        delay = strategy(state)
        return delay if deadline is None else max(0.0, min(delay, deadline - clock()))

    return {
        "retry": retry_if_exception(is_transient),
        "wait": wait,
        "stop": lambda _state: deadline is not None and clock() >= deadline,
        "before_sleep": note,
        "reraise": True,
    }
