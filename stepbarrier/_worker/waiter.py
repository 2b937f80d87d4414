"""A worker's side: hold until the chief's published step reaches a target.

The wait is race-free: subscribe to the job's channel, read the confirmation,
then register and read the stored state, then wait for announcements. An
announcement wakes the worker within milliseconds; the stored state is the
truth and is read again after every reconnect and every ``fallback_interval``
(a lost message, a half-open connection or a Redis restart costs at most that).
A released wait does not close its subscription (that is ``close``'s work, off
the release's path): the waiter's next wait takes it over if it is younger
than ``fallback_interval``, after discarding what arrived in between.

A stored step releases a worker only through a write the wait sees happen
(an announcement, or a read that differs from the last one) of a chief that
vouches for it, so a step left by a crashed or recovering chief, which may
restart from an older checkpoint, is not trusted; no stored time is compared
with any clock (docs/protocol.md, decided in ``stepbarrier._worker.wait_state``). A
worker trusts only the state of its own run (``STEPBARRIER_RUN_ID``): another
run's chief neither releases nor aborts it.

A wait may also be given a ``StepSource``: a second witness of the step that
it trusts as it stands, read before Redis is touched and then every
``interval`` seconds (TensorFlow's hook passes the session's global step, the
one thing TensorFlow's own hook reads). The wait then ends at whichever comes
first, and is never less patient than the witness alone: Redis being down or
refusing only leaves the witness to wait on, and the stall timeout holds only
once a write of the chief was seen.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import redis

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.wire import StepAnnouncement, parse_announcement
from stepbarrier._redis.bounded import LEAVE_WITHIN, call_timeout
from stepbarrier._redis.client import SOCKET_TIMEOUT, RedisClient, make_client
from stepbarrier._redis.functions import RedisCode
from stepbarrier._redis.retries import call_with_retries
from stepbarrier._redis.subscription import KeptSubscription, Subscription
from stepbarrier._worker.follow import Crossed, FollowPlan
from stepbarrier._worker.links import WaiterLink
from stepbarrier._worker.timing import READ, READ_SOURCE, LastChance, Receive
from stepbarrier._worker.wait_state import ReadNow, WaitRules, wait_target
from stepbarrier.errors import BarrierAborted, BarrierTimeout, RedisRefused, RedisUnavailable

log = logging.getLogger("stepbarrier._worker.waiter")


SOURCE_SOCKET_TIMEOUT = 1.0
"""Seconds a Redis reply may take for a waiter whose waits read a ``StepSource``."""
SOURCE_RETRY_WITHIN = 1.0
"""Seconds a wait with a ``StepSource`` retries a failing Redis call before it
waits on the source alone (the source is read during the retries too)."""
REDIS_RETRY_EVERY = 5.0
"""Seconds between tries to reach a lost Redis while a wait with a ``StepSource``
waits on the source alone."""


@dataclass(frozen=True)
class StepSource:
    """A second witness of the job's step that a wait trusts as it stands.

    Attributes:
        read: Returns the step now (TensorFlow: ``int(session.run(global_step))``,
            a read of the parameter server). What it raises ends the wait.
        name: What it is, for log lines: ``"the session's global step"``.
        interval: Seconds between reads while no write of the chief was seen
            (TensorFlow's own hook reads every 0.5 s).
        interval_with_chief: Seconds between reads once a write of the chief
            was seen and while Redis answers: Redis then wakes the wait, and the
            source is only the safety net.
        hint: Said once, in a WARNING, when the source released a wait that
            never saw a write of its chief (how to add a publisher).
    """

    read: Callable[[], int]
    name: str
    interval: float = 0.5
    interval_with_chief: float = 5.0
    hint: str = ""

    def __post_init__(self) -> None:
        for name in ("interval", "interval_with_chief"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(
                    f"StepSource.{name} must be a positive number of seconds, got {value!r}"
                )
        if not callable(self.read):
            raise TypeError(f"StepSource.read must be callable, got {self.read!r}")

    @property
    def intervals(self) -> tuple[float, float]:
        """``(interval, interval_with_chief)``."""
        return self.interval, self.interval_with_chief


class _SourceReleased(Exception):
    """The source reached the target while the wait was inside a Redis retry."""

    def __init__(self, step: int) -> None:
        super().__init__(step)
        self.step = step


class StepWaiter:
    """Waits for a job's chief to reach a global step.

    Args:
        config: The job's settings (``timeout``, ``stall_timeout``, ``on_timeout``
            and ``task_id`` shape each wait).
        client: A redis-py client; one is made from ``config`` if omitted.
        clock: Monotonic clock, injectable for tests.
        sleep: Sleep between retries, injectable for tests.
        socket_timeout: Seconds a Redis reply (or connect) of a client the
            waiter makes may take before the connection counts as dead. A
            waiter whose waits read a ``StepSource`` takes a short one
            (``SOURCE_SOCKET_TIMEOUT``): a Redis that hangs delays the
            source's reads by no more. Whatever it is, each call of a wait is
            also bounded by the time left to the wait's nearest limit (at
            least ``CALL_FLOOR``), so a wait ends within its limits against a
            Redis that hangs, and leaving takes ``LEAVE_WITHIN`` at most.

    Example:
        ```python
        with StepWaiter(BarrierConfig(job="demo", task_id=2)) as waiter:
            step = waiter.wait(until_step=13, timeout=600)  # the step seen, >= 13
        ```
    """

    def __init__(
        self,
        config: BarrierConfig,
        client: RedisClient | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        socket_timeout: float = SOCKET_TIMEOUT,
    ) -> None:
        self.config = config
        self._socket_timeout = socket_timeout
        self._owns_client = client is None
        # made at the first wait, within its retries (a cluster client reads the
        # slot map at once, and Redis may be down)
        self._client: RedisClient | None = client
        self._client_lock = threading.Lock()
        self._code_of: RedisCode | None = None  # shared by the waits (its connections too)
        self._clock = clock
        self._sleep = sleep
        self._kept = KeptSubscription(clock, config.fallback_interval)  # for the next wait
        # registry ids the last waits left, for the next ones (one per wait at a
        # time): a waiter that waits again writes over its entry, not a new one
        self._ids: list[str] = []
        self.last_generation: int | None = None
        """The chief generation of the last wait's release (``None`` before one); a
        worker that reports the step passes it to its contributor
        (``StepPublisher(contributor=True, join_generation=...)``)."""
        self.last_released_by: str | None = None
        """What released the last wait: ``"an announcement"``, ``"a read of the
        state"`` (Redis), or the ``StepSource``'s name; ``None`` before a release."""

    @classmethod
    def from_env(cls) -> StepWaiter:
        """A waiter configured from ``STEPBARRIER_*`` variables and ``TF_CONFIG``."""
        return cls(BarrierConfig.from_env())

    def wait(
        self, until_step: int, timeout: float | None = None, *, source: StepSource | None = None
    ) -> int:
        """Block until the chief's published step is at least ``until_step``.

        Args:
            until_step: The step to wait for (an integer up to 2**53 - 2, the
                largest a chief can publish); ``<= 0`` returns 0 at once without
                touching Redis.
            timeout: Overall limit in seconds; ``None`` uses ``config.timeout``
                (itself ``None`` for no overall limit; the stall timeout still holds).
            source: A second witness of the step (see ``StepSource``), read
                before Redis and then on its interval; a step of it at or above
                ``until_step`` releases the wait. With one, Redis being
                unreachable or refusing never ends the wait (it is said once,
                and Redis is tried again every ``REDIS_RETRY_EVERY`` seconds),
                and the stall timeout holds only once a write of the chief was
                seen and while Redis answers.

        Returns:
            The step seen (``>= until_step``). Under ``on_timeout="proceed"`` a
            timeout logs a warning and returns the last step seen (0 if none).

        Raises:
            BarrierTimeout: The overall or the stall timeout passed (also when
                Redis, once reached, stayed unreachable for that long).
            BarrierAborted: The job finished or was reset before the step came.
            RedisUnavailable: Redis could not be reached at all before a deadline.
            RedisRefused: Redis refused us (authentication, ACL, TLS).
            TypeError: ``until_step`` is not an integer (``True`` is not step 1).
            ValueError: ``until_step`` is above 2**53 - 2 (``MAX_STEP``).
        """
        return self._wait(until_step, timeout, source)[0]

    def follow(
        self, every: int, start: int | None = None, timeout: float | None = None
    ) -> Iterator[Crossed]:
        """Yield, in order, every multiple of ``every`` that the chief's step reaches.

        None is skipped: when the chief moves past several multiples between two
        announcements, each is yielded, with the step seen (``Crossed.step``).
        Each multiple is awaited as ``wait`` awaits a step (woken by the chief's
        announcement, no polling), so it ends the same ways.

        Args:
            every: The interval in steps (a positive integer).
            start: Yield the multiples from the first at or above ``start``;
                ``None``: from the first above the step the chief has reached
                when the following begins.
            timeout: The limit of each wait for the next multiple (``None``:
                ``config.timeout``); the stall timeout holds as for ``wait``.

        Yields:
            ``Crossed(multiple, step)`` for ``every``, ``2 * every``, ... from
            the start on.

        Returns:
            When the job finishes (its last step below the next multiple), or
            when a wait ends under ``on_timeout="proceed"`` (it logged why).

        Raises:
            BarrierTimeout, BarrierAborted (a reset), RedisUnavailable, RedisRefused:
                as ``wait`` raises them.
            TypeError, ValueError: ``every`` or ``start`` is not a step.

        Example:
            ```python
            with StepWaiter(BarrierConfig(job="demo", role="worker", task_id=9)) as waiter:
                for crossed in waiter.follow(every=1000):
                    evaluate(checkpoint_at=crossed.multiple)
            ```
        """
        plan = FollowPlan(every, start)
        while not plan.exhausted:
            try:
                step, before, released = self._wait(plan.target, timeout, None)
            except BarrierAborted as exc:
                if plan.ends(exc):
                    return
                raise
            if not released:
                return  # on_timeout="proceed": the wait said why; nothing was crossed
            yield from plan.released(step, before)

    def _wait(
        self, until_step: int, timeout: float | None, source: StepSource | None
    ) -> tuple[int, int | None, bool]:
        """``wait``, the step its first read found (``WaitRules.first_step``), and
        whether it was released (``False``: it ended under ``on_timeout="proceed"``)."""
        target = wait_target(until_step)
        if target <= 0:
            return 0, None, True
        limit = self.config.timeout if timeout is None else timeout
        wait = _Wait(self, target, limit, source)
        try:
            released = wait.run()
            self.last_generation = wait.rules.generation or None
            self.last_released_by = wait.rules.released_by
            return released, wait.rules.first_step, True
        except (BarrierTimeout, RedisUnavailable) as exc:
            return wait.rules.proceed_after(exc), None, False
        finally:
            wait.leave()

    def close(self) -> None:
        """Close the last wait's subscription, and the client if the waiter made it."""
        with self._client_lock:
            client, self._client = self._client, None
            code, self._code_of = self._code_of, None
        self._kept.close()
        if code is not None:
            code.close()
        if self._owns_client and client is not None:
            client.close()
        elif client is not None:
            with self._client_lock:  # the caller's client stays the waiter's to use
                self._client = self._client or client

    def _connected(self) -> RedisClient:
        with self._client_lock:
            if self._client is None:
                self._client = make_client(self.config, socket_timeout=self._socket_timeout)
            return self._client

    def _code(self) -> RedisCode:
        """The code runner of the waits (made on first use; its bounded calls keep
        their idle connection for the next wait)."""
        client = self._connected()
        with self._client_lock:
            if self._code_of is None:
                self._code_of = RedisCode(client, self.config)
            return self._code_of

    def __enter__(self) -> StepWaiter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class _Wait:
    """The I/O of one ``wait`` call; ``WaitRules`` decides."""

    def __init__(
        self, waiter: StepWaiter, target: int, timeout: float | None, source: StepSource | None
    ) -> None:
        self.waiter = waiter
        self.config = waiter.config
        self.keys = waiter.config.keys
        self.clock = waiter._clock
        self.source = source
        self.rules = WaitRules(
            self.config,
            target,
            timeout,
            self.clock,
            log,
            outside=None if source is None else source.name,
            outside_every=(0.5, 5.0) if source is None else source.intervals,
        )
        with waiter._client_lock:
            waiter_id = waiter._ids.pop() if waiter._ids else None
        self.link = WaiterLink(
            waiter._connected,
            self.config,
            target,
            since=time.time(),
            code=waiter._code,
            call_timeout=self._call_timeout,
            waiter_id=waiter_id,
        )
        self.pubsub: Subscription | None = None
        self.subscriptions = 0
        self.calls_until = self.clock()
        """When the current call's retries end (``clock()`` time): each try of it
        may take the time left to then (a wait's calls end within its limits)."""

    # -- the loop -----------------------------------------------------------------

    def run(self) -> int:
        self.rules.begin()
        try:
            released = self._read_source()
            if released is not None:
                return released
            while True:
                try:
                    return self._loop()
                except (RedisUnavailable, RedisRefused) as exc:
                    if self.source is None:
                        if isinstance(exc, RedisRefused):
                            raise
                        raise self.rules.unreachable(exc) from exc
                    released = self._on_source_alone(exc)
                    if released is not None:
                        return released
        except _SourceReleased as outcome:
            return outcome.step

    # -- the outside witness -----------------------------------------------------

    def _read_source(self) -> int | None:
        """Read the source if its time has come: the releasing step, or ``None``."""
        source = self.source
        if source is None or self.clock() < self.rules.source_at:
            return None
        return self.rules.on_outside_step(source.read(), source.hint)

    def _sleep(self, seconds: float) -> None:
        """Sleep (between Redis retries), reading the source when its time comes."""
        if self.source is None:
            self.waiter._sleep(seconds)
            return
        end = self.clock() + seconds
        while True:
            released = self._read_source()
            if released is not None:
                raise _SourceReleased(released)
            left = end - self.clock()
            if left <= 0:
                return
            self.waiter._sleep(max(0.001, min(left, self.rules.source_at - self.clock())))

    def _retry_deadline(self) -> float:
        deadline = self.rules.retry_deadline()
        if self.source is not None:
            # Redis is only one of two witnesses: do not hang on it
            deadline = min(deadline, self.clock() + SOURCE_RETRY_WITHIN)
        # each try of the call is bounded by what is left to it (_call_timeout)
        self.calls_until = deadline
        return deadline

    def _call_timeout(self) -> float:
        """Seconds the Redis call about to be made may take: the time left to the
        wait's nearest limit (the end of the current call's retries), ``CALL_FLOOR``
        at least (the last read at a passed limit)."""
        return call_timeout(self.calls_until, self.clock())

    def _on_source_alone(self, exc: RedisUnavailable | RedisRefused) -> int | None:
        """Redis is lost or refuses: wait on the source alone, as without stepbarrier.

        Returns the releasing step, or ``None`` when it is time to try Redis again
        (never after a refusal: that needs an operator).

        Raises:
            BarrierTimeout: The overall or the progress timeout passed.
        """
        rules = self.rules
        assert self.source is not None
        refused = isinstance(exc, RedisRefused)
        if not rules.redis_lost:
            rules.redis_lost = True
            # the source alone now: at its own pace, not the pace Redis allowed
            rules.source_at = min(rules.source_at, self.clock() + self.source.interval)
            self._close_pubsub()
            log.warning(
                "job %s: %s; waiting on %s alone%s",
                self.config.job,
                exc,
                self.source.name,
                "" if refused else f", and trying Redis again every {REDIS_RETRY_EVERY:g} s",
            )
        retry_at = self.clock() + REDIS_RETRY_EVERY
        while refused or self.clock() < retry_at:
            released = self._read_source()
            if released is not None:
                return released
            now = self.clock()
            limit = rules.passed(now)
            if limit is not None:
                rules.after_last_chance(limit, None)
            if now >= rules.next_progress:
                rules.log_progress()
            stop = rules.next_stop(reading=False)
            if not refused:
                stop = min(stop, retry_at)
            self.waiter._sleep(max(0.001, stop - self.clock()))
        return None

    # -- the loop -----------------------------------------------------------------

    def _loop(self) -> int:
        rules = self.rules
        released = self._resume()  # the step may have come before we did
        if rules.redis_lost:
            # the stall timeout holds again, counted from now: while Redis was
            # lost, no chief could be seen
            rules.redis_lost = False
            rules.last_alive = max(rules.last_alive, self.clock())
            log.info("job %s: Redis answers again", self.config.job)
        while released is None:
            action = rules.next_action(self.clock())
            if isinstance(action, Receive):
                released = self._receive(action.timeout)
            elif action is READ:
                released = self._read()
            elif action is READ_SOURCE:
                released = self._read_source()
            elif isinstance(action, LastChance):
                released = rules.after_last_chance(action.limit, self._last_chance())
            else:  # RESUBSCRIBE
                released = self._reconnect()
        return released

    def _receive(self, timeout: float) -> int | None:
        """Take the next message, if one comes within ``timeout`` seconds, and judge it."""
        assert self.pubsub is not None
        try:
            message = self.pubsub.get_message(timeout=timeout)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            # SubscriptionLost too: in a cluster, the job's slot moved
            log.info("job %s: subscription lost (%s); reconnecting", self.config.job, exc)
            return self._reconnect()
        return None if message is None else self._on_message(message)

    def _on_message(self, data: Any) -> int | None:
        announcement = parse_announcement(data)
        outcome = self.rules.on_announcement(announcement, data)
        if isinstance(outcome, ReadNow):
            return self._read(after=announcement)
        if outcome is not None:
            # the chief's script that announced it removed our registry entry
            self.link.registered = False
        return outcome

    def _read(self, after: StepAnnouncement | None = None) -> int | None:
        """Register (or refresh) and judge the stored state: the truth (``after``:
        the announcement it is read for)."""
        snapshot = call_with_retries(
            self.link.register_and_read,
            self.config,
            action="read the job's state",
            deadline=self._retry_deadline(),
            clock=self.clock,
            sleep=self._sleep,
            quiet=self.source is not None,  # _on_source_alone says it once
        )
        self.rules.read_done()  # (every read of this wait registers too)
        return self.rules.on_snapshot(snapshot, after)

    def _resume(self) -> int | None:
        """Take over the last wait's subscription if it is fresh, else subscribe; then read."""
        pubsub = self.waiter._kept.take()
        if pubsub is None:
            return self._reconnect()
        if not pubsub.drain():  # what came before the read is older than it
            pubsub.close()
            return self._reconnect()
        self.pubsub = pubsub
        self.subscriptions += 1
        self.rules.subscribed()
        return self._read()

    def _reconnect(self) -> int | None:
        """Subscribe, read the confirmation, then read the state (in that order)."""
        self._close_pubsub()
        # after a lost subscription, a cluster's slot map is read again: the
        # job's slot may have moved, or its master failed over
        refresh = self.subscriptions > 0
        self.pubsub = call_with_retries(
            lambda: self.link.subscribe(refresh_topology=refresh),
            self.config,
            action=f"subscribe to {self.keys.channel}",
            deadline=self._retry_deadline(),
            clock=self.clock,
            sleep=self._sleep,
            quiet=self.source is not None,  # _on_source_alone says it once
        )
        self.subscriptions += 1
        self.rules.subscribed()
        return self._read()

    # -- endings -------------------------------------------------------------------

    def _last_chance(self) -> int | None:
        try:
            return self._read()  # (past the limit: bounded by CALL_FLOOR)
        except RedisUnavailable:
            return None
        except RedisRefused:
            if self.source is None:
                raise
            return None

    def _close_pubsub(self) -> None:
        pubsub, self.pubsub = self.pubsub, None
        if pubsub is not None:
            pubsub.close()

    def leave(self) -> None:
        """Unregister (one try within ``LEAVE_WITHIN``: an entry left behind expires
        by itself).

        The subscription stays open for the waiter's next wait (``StepWaiter.close``
        closes it): closing it here would cost every released worker a socket
        shutdown, and Redis a disconnection, on the release's path.
        """
        if self.rules.redis_lost:
            # no try: Redis is lost (it may hang); the entry expires by itself
            self._close_pubsub()
            return
        left = False
        try:
            if self.link.answered:
                self.link.leave(timeout=LEAVE_WITHIN)
                left = True
            # else the wait's last call found Redis unreachable (or hung): no
            # try, and the entry expires by itself
        except Exception as exc:
            log.debug("job %s: could not unregister (%s); it expires", self.config.job, exc)
        finally:
            if left:
                # the id is for the waiter's next wait only once Redis answered the
                # leave: a command of this wait still on its way (unanswered, or a
                # leave that timed out) could else land on the next wait's entry
                with self.waiter._client_lock:
                    self.waiter._ids.append(self.link.id)
            pubsub, self.pubsub = self.pubsub, None
            if pubsub is not None:
                self.waiter._kept.keep(pubsub)
