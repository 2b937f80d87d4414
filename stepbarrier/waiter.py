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
with any clock (docs/protocol.md, decided in ``stepbarrier.wait_rules``). A
worker trusts only the state of its own run (``STEPBARRIER_RUN_ID``): another
run's chief neither releases nor aborts it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import redis

from stepbarrier.config import BarrierConfig
from stepbarrier.connection import RedisClient, call_with_retries, make_client
from stepbarrier.errors import BarrierTimeout, RedisUnavailable
from stepbarrier.protocol import StepAnnouncement, parse_announcement
from stepbarrier.subscription import KeptSubscription, Subscription
from stepbarrier.wait_rules import PROGRESS_EVERY, ReadNow, WaitRules, wait_target
from stepbarrier.waiter_link import WaiterLink

log = logging.getLogger("stepbarrier.waiter")

__all__ = ["PROGRESS_EVERY", "StepWaiter"]


class StepWaiter:
    """Waits for a job's chief to reach a global step.

    Args:
        config: The job's settings (``timeout``, ``stall_timeout``, ``on_timeout``
            and ``task_id`` shape each wait).
        client: A redis-py client; one is made from ``config`` if omitted.
        clock: Monotonic clock, injectable for tests.
        sleep: Sleep between retries, injectable for tests.

    Example:
        >>> waiter = StepWaiter(BarrierConfig(job="demo", task_id=2))  # doctest: +SKIP
        >>> waiter.wait(until_step=13, timeout=600)  # doctest: +SKIP
        13
    """

    def __init__(
        self,
        config: BarrierConfig,
        client: RedisClient | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config
        self._owns_client = client is None
        # made at the first wait, within its retries (a cluster client reads the
        # slot map at once, and Redis may be down)
        self._client: RedisClient | None = client
        self._client_lock = threading.Lock()
        self._clock = clock
        self._sleep = sleep
        self._kept = KeptSubscription(clock, config.fallback_interval)  # for the next wait
        self.last_generation: int | None = None
        """The chief generation of the last wait's release (``None`` before one); a
        worker that reports the step passes it to its contributor
        (``StepPublisher(contributor=True, join_generation=...)``)."""

    @classmethod
    def from_env(cls) -> StepWaiter:
        """A waiter configured from ``STEPBARRIER_*`` variables and ``TF_CONFIG``."""
        return cls(BarrierConfig.from_env())

    def wait(self, until_step: int, timeout: float | None = None) -> int:
        """Block until the chief's published step is at least ``until_step``.

        Args:
            until_step: The step to wait for (an integer up to 2**53, the
                largest a chief can publish); ``<= 0`` returns 0 at once without
                touching Redis.
            timeout: Overall limit in seconds; ``None`` uses ``config.timeout``
                (itself ``None`` for no overall limit; the stall timeout still holds).

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
            ValueError: ``until_step`` is above 2**53.
        """
        target = wait_target(until_step)
        if target <= 0:
            return 0
        limit = self.config.timeout if timeout is None else timeout
        wait = _Wait(self, target, limit)
        try:
            released = wait.run()
            self.last_generation = wait.rules.generation or None
            return released
        except (BarrierTimeout, RedisUnavailable) as exc:
            return wait.rules.proceed_after(exc)
        finally:
            wait.leave()

    def close(self) -> None:
        """Close the last wait's subscription, and the client if the waiter made it."""
        with self._client_lock:
            client, self._client = self._client, None
        self._kept.close()
        if self._owns_client and client is not None:
            client.close()
        elif client is not None:
            with self._client_lock:  # the caller's client stays the waiter's to use
                self._client = self._client or client

    def _connected(self) -> RedisClient:
        with self._client_lock:
            if self._client is None:
                self._client = make_client(self.config)
            return self._client

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

    def __init__(self, waiter: StepWaiter, target: int, timeout: float | None) -> None:
        self.waiter = waiter
        self.config = waiter.config
        self.keys = waiter.config.keys
        self.clock = waiter._clock
        self.rules = WaitRules(self.config, target, timeout, self.clock, log)
        self.link = WaiterLink(waiter._connected, self.config, target, since=time.time())
        self.pubsub: Subscription | None = None
        self.subscriptions = 0

    # -- the loop -----------------------------------------------------------------

    def run(self) -> int:
        try:
            return self._loop()
        except RedisUnavailable as exc:
            raise self.rules.unreachable(exc) from exc

    def _loop(self) -> int:
        rules = self.rules
        rules.begin()
        released = self._resume()  # the step may have come before we did
        if released is not None:
            return released
        next_read = self.clock() + self.config.fallback_interval
        while True:
            now = self.clock()
            if now >= next_read:
                result = self._read()
                if result is not None:
                    return result
                next_read = self.clock() + self.config.fallback_interval
                now = self.clock()
            released = self._check_limits(now)
            if released is not None:
                return released
            if rules.resubscribe:
                result = self._reconnect()
                if result is not None:
                    return result
            if now >= rules.next_progress:
                rules.log_progress()
            assert self.pubsub is not None
            stop = rules.next_stop(next_read)
            try:
                message = self.pubsub.get_message(
                    timeout=max(0.001, min(stop - now, self.config.fallback_interval))
                )
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                # SubscriptionLost too: in a cluster, the job's slot moved
                log.info("job %s: subscription lost (%s); reconnecting", self.config.job, exc)
                result = self._reconnect()
                if result is not None:
                    return result
                next_read = self.clock() + self.config.fallback_interval
                continue
            if message is not None:
                result = self._on_message(message)
                if result is not None:
                    return result

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
            self.link.sync,
            self.config,
            action="read the job's state",
            deadline=self.rules.retry_deadline(),
            clock=self.clock,
            sleep=self.waiter._sleep,
        )
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
            deadline=self.rules.retry_deadline(),
            clock=self.clock,
            sleep=self.waiter._sleep,
        )
        self.subscriptions += 1
        self.rules.subscribed()
        return self._read()

    # -- limits and endings -------------------------------------------------------

    def _check_limits(self, now: float) -> int | None:
        """Raise at a passed deadline, after one last read (a release may have come)."""
        limit = self.rules.passed(now)
        if limit is None:
            return None
        return self.rules.after_last_chance(limit, self._last_chance())

    def _last_chance(self) -> int | None:
        try:
            return self._read()
        except RedisUnavailable:
            return None

    def _close_pubsub(self) -> None:
        pubsub, self.pubsub = self.pubsub, None
        if pubsub is not None:
            pubsub.close()

    def leave(self) -> None:
        """Unregister (one quick try: an entry left behind expires by itself).

        The subscription stays open for the waiter's next wait (``StepWaiter.close``
        closes it): closing it here would cost every released worker a socket
        shutdown, and Redis a disconnection, on the release's path.
        """
        try:
            self.link.leave()
        except Exception as exc:
            log.debug("job %s: could not unregister (%s); it expires", self.config.job, exc)
        finally:
            pubsub, self.pubsub = self.pubsub, None
            if pubsub is not None:
                self.waiter._kept.keep(pubsub)
