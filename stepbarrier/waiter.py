"""A worker's side: hold until the chief's published step reaches a target.

The wait is race-free: subscribe to the job's channel, read the confirmation,
then register and read the stored state, then wait for announcements. An
announcement wakes the worker within milliseconds; the stored state is the
truth and is read again after every reconnect and every ``fallback_interval``
(a lost message, a half-open connection or a Redis restart costs at most that).

The chief's heartbeat tells a slow chief from a dead one: a stored step only
releases a worker while its chief is alive and its training loop published it
lately (or the job has finished), so a step left by a crashed or recovering
chief, which may restart from an older checkpoint, is not trusted (see
``stepbarrier.freshness``). A worker trusts only the state of its own run
(``STEPBARRIER_RUN_ID``): another run's chief neither releases nor aborts it.
"""

from __future__ import annotations

import logging
import operator
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import redis

from stepbarrier.config import BarrierConfig
from stepbarrier.connection import RedisClient, call_with_retries, make_client
from stepbarrier.errors import (
    BarrierAborted,
    BarrierTimeout,
    RedisUnavailable,
)
from stepbarrier.freshness import fresh_heartbeat_limit as _fresh_limit
from stepbarrier.freshness import heartbeat_age, vouches_for_step
from stepbarrier.protocol import ChiefState, parse_announcement, preview
from stepbarrier.subscription import Subscription
from stepbarrier.waiter_link import WaiterLink

log = logging.getLogger("stepbarrier.waiter")

PROGRESS_EVERY = 30.0
"""Seconds between progress lines while a wait goes on."""


def fresh_heartbeat_limit(config: BarrierConfig) -> float:
    """Seconds after which a heartbeat of ``config``'s period no longer vouches for its step."""
    return _fresh_limit(config.heartbeat)


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

    @classmethod
    def from_env(cls) -> StepWaiter:
        """A waiter configured from ``STEPBARRIER_*`` variables and ``TF_CONFIG``."""
        return cls(BarrierConfig.from_env())

    def wait(self, until_step: int, timeout: float | None = None) -> int:
        """Block until the chief's published step is at least ``until_step``.

        Args:
            until_step: The step to wait for; ``<= 0`` returns 0 at once without
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
        """
        target = operator.index(until_step)
        if target <= 0:
            return 0
        limit = self.config.timeout if timeout is None else timeout
        wait = _Wait(self, target, limit)
        try:
            return wait.run()
        except (BarrierTimeout, RedisUnavailable) as exc:
            if self.config.on_timeout != "proceed":
                raise
            log.warning("%s; proceeding as STEPBARRIER_ON_TIMEOUT=proceed says", exc)
            return wait.last_step or 0
        finally:
            wait.leave()

    def close(self) -> None:
        """Release the connection (only if the waiter made its own client)."""
        with self._client_lock:
            client, self._client = self._client, None
        if self._owns_client and client is not None:
            client.close()

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
    """The state of one ``wait`` call."""

    def __init__(self, waiter: StepWaiter, target: int, timeout: float | None) -> None:
        self.waiter = waiter
        self.config = waiter.config
        self.keys = waiter.config.keys
        self.clock = waiter._clock
        self.target = target
        self.started = self.clock()
        self.deadline = None if timeout is None else self.started + timeout
        self.link = WaiterLink(waiter._connected, self.config, target, since=time.time())
        self.pubsub: Subscription | None = None
        self.subscriptions = 0
        self.last_step: int | None = None
        self.generation = 0
        self.heartbeat_age: float | None = None
        self.last_alive = self.started
        self.start_ms: int | None = None
        self.reads_without_message = 0
        self.read_step: int | None = None
        self.resubscribe = False
        self.next_progress = self.started + PROGRESS_EVERY
        self.last_progress = self.started
        self.warned: set[str] = set()

    # -- the loop -----------------------------------------------------------------

    def run(self) -> int:
        try:
            return self._loop()
        except RedisUnavailable as exc:
            raise self._unreachable(exc) from exc

    def _loop(self) -> int:
        log.info(
            "job %s: waiting for step %d (task %s)",
            self.config.job,
            self.target,
            self.config.task_id,
        )
        released = self._reconnect()  # the step may have come before we did
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
            if self.resubscribe:
                result = self._reconnect()
                if result is not None:
                    return result
            if now >= self.next_progress:
                self._log_progress()
            assert self.pubsub is not None
            stop = min(
                t
                for t in (
                    next_read,
                    self.next_progress,
                    self._stall_at(),
                    self.deadline,
                    self._progress_at(),
                )
                if t is not None
            )
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
        self.reads_without_message = 0
        announcement = parse_announcement(data)
        if announcement is None:
            log.warning(
                "job %s: ignored a malformed message on %s: %s",
                self.config.job,
                self.keys.channel,
                preview(data),
            )
            return None
        if announcement.reset:
            raise self._aborted("reset")
        assert announcement.step is not None and announcement.generation is not None
        if announcement.run_id != self.config.run_id:
            return None  # another run's chief: it neither releases nor aborts us
        if announcement.generation < self.generation:
            return None  # an older chief's announcement, overtaken by what we read
        if announcement.generation > self.generation:
            # a chief generation this wait has not read yet: the state (and a
            # reset marker this wait may have missed the announcement of) decide
            return self._read()
        self.generation = announcement.generation
        self._seen_step(announcement.step)
        self.last_alive = self.clock()
        self.heartbeat_age = 0.0
        if announcement.step >= self.target:
            # the chief's script that announced it removed our registry entry
            self.link.registered = False
            return self._released(announcement.step, by="an announcement")
        if announcement.done:
            raise self._aborted("done")
        return None

    def _read(self) -> int | None:
        """Register (or refresh) and judge the stored state: the truth."""
        snapshot = call_with_retries(
            self.link.sync,
            self.config,
            action="read the job's state",
            deadline=self._retry_deadline(),
            clock=self.clock,
            sleep=self.waiter._sleep,
        )
        now_ms, reset_ms, state = snapshot.now_ms, snapshot.reset_ms, snapshot.state
        if self.start_ms is None:
            self.start_ms = now_ms
        if reset_ms is not None and reset_ms >= self.start_ms:
            raise self._aborted("reset")  # whatever a chief wrote since
        if state.problem:
            log.warning("job %s: %s; waiting for a valid step", self.config.job, state.problem)
        if state.step is None or state.generation is None or not self._trusts(state):
            return None
        if state.generation < self.generation:
            return None  # e.g. a failover lost the newest write; the chief rewrites it
        self.generation = state.generation
        self._seen_step(state.step)
        self.heartbeat_age = heartbeat_age(state, now_ms)
        if self.heartbeat_age is not None:
            self.last_alive = max(self.last_alive, self.clock() - self.heartbeat_age)
        if state.step >= self.target and vouches_for_step(state, now_ms, self.config.heartbeat):
            return self._released(state.step, by="a read of the state")
        if state.done and state.step < self.target:
            raise self._aborted("done")
        self._check_subscription(state.step)
        return None

    def _trusts(self, state: ChiefState) -> bool:
        """False for state this wait must ignore: another run's, or an old finished one."""
        run_id = self.config.run_id
        if state.run_id != run_id:
            self._warn_once(
                "run",
                logging.INFO,
                "job %s: the stored state belongs to run %s, not to this worker's run %s; "
                "waiting for this run's chief",
                self.config.job,
                state.run_id or "(none)",
                run_id or "(none)",
            )
            return False
        assert self.start_ms is not None
        done_ms = state.done_ms if state.done else None
        if run_id is None and done_ms is not None and done_ms < self.start_ms:
            # finished before we started, and no run id says it is ours:
            # most likely an earlier run under the same job name
            self._warn_once(
                "old-done",
                logging.WARNING,
                "job %s: found a job finished %.0f s before this worker started (step %s); "
                "not trusting it and waiting for a new chief. Give each run its own "
                "STEPBARRIER_RUN_ID, or wait STEPBARRIER_DONE_TTL (%d s) for the finished "
                "state to expire, or clear it with `stepbarrier reset`",
                self.config.job,
                (self.start_ms - done_ms) / 1000.0,
                state.step,
                self.config.done_ttl,
            )
            return False
        return True

    def _warn_once(self, topic: str, level: int, message: str, *args: object) -> None:
        if topic not in self.warned:
            self.warned.add(topic)
            log.log(level, message, *args)

    def _seen_step(self, step: int) -> None:
        if step != self.last_step:
            self.last_progress = self.clock()
        self.last_step = step

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
            sleep=self.waiter._sleep,
        )
        self.subscriptions += 1
        self.reads_without_message = 0
        self.read_step = None
        self.resubscribe = False
        return self._read()

    # -- limits, logging, endings -------------------------------------------------

    def _stall_at(self) -> float:
        return self.last_alive + self.config.stall_timeout

    def _retry_deadline(self) -> float:
        stall = self._stall_at()
        return stall if self.deadline is None else min(stall, self.deadline)

    def _check_limits(self, now: float) -> int | None:
        """Raise at a passed deadline, after one last read (a release may have come)."""
        if self.deadline is not None and now >= self.deadline:
            released = self._last_chance()
            if released is None:
                raise self._timeout(stalled=False)
            return released
        if now >= self._stall_at():
            released = self._last_chance()
            if released is None and self.clock() >= self._stall_at():
                raise self._timeout(stalled=True)
            return released
        progress_at = self._progress_at()
        if progress_at is not None and now >= progress_at:
            released = self._last_chance()
            if released is None and self.clock() >= (self._progress_at() or progress_at):
                raise self._timeout(stalled=True, progress=True)
            return released
        return None

    def _progress_at(self) -> float | None:
        limit = self.config.progress_timeout
        return None if limit is None else self.last_progress + limit

    def _last_chance(self) -> int | None:
        try:
            return self._read()
        except RedisUnavailable:
            return None

    def _check_subscription(self, step: int) -> None:
        # The chief announces every change of step within a heartbeat. If reads
        # keep finding a step that moved while no message arrived, the
        # subscription is dead (say, a half-open connection): start a new one.
        if self.read_step is not None and step != self.read_step:
            self.reads_without_message += 1
        self.read_step = step
        if self.reads_without_message >= 2:
            log.info(
                "job %s: the step moves but no announcement comes; resubscribing", self.config.job
            )
            self.resubscribe = True

    def _log_progress(self) -> None:
        self.next_progress = self.clock() + PROGRESS_EVERY
        age = "unknown" if self.heartbeat_age is None else f"{self.heartbeat_age:.1f} s"
        log.info(
            "job %s: still waiting for step %d after %.0f s (chief at step %s, heartbeat %s ago)",
            self.config.job,
            self.target,
            self.clock() - self.started,
            "none yet" if self.last_step is None else self.last_step,
            age,
        )

    def _released(self, step: int, *, by: str) -> int:
        log.info(
            "job %s: released at step %d (target %d) after %.3f s, by %s",
            self.config.job,
            step,
            self.target,
            self.clock() - self.started,
            by,
        )
        self.last_step = step
        return step

    def _timeout(self, *, stalled: bool, progress: bool = False) -> BarrierTimeout:
        age = "never seen" if self.heartbeat_age is None else f"{self.heartbeat_age:.1f} s old"
        seen = "none" if self.last_step is None else str(self.last_step)
        if progress:
            why = (
                f"the chief's step did not move for {self.config.progress_timeout:g} s "
                "(progress timeout, STEPBARRIER_PROGRESS_TIMEOUT)"
            )
        elif stalled:
            why = f"no chief heartbeat for {self.config.stall_timeout:g} s (stall timeout)"
        else:
            why = f"overall timeout of {self.deadline and self.deadline - self.started:g} s passed"
        return BarrierTimeout(
            f"job {self.config.job}: gave up waiting for step {self.target}: {why}; "
            f"last step seen {seen}, chief heartbeat {age}",
            job=self.config.job,
            target=self.target,
            last_step=self.last_step,
            heartbeat_age=self.heartbeat_age,
            stalled=stalled,
        )

    def _unreachable(self, exc: RedisUnavailable) -> BarrierTimeout | RedisUnavailable:
        """The error for a wait whose retries ran out: ``exc`` with this wait's context.

        A wait that had reached Redis and then lost it until its stall or overall
        timeout ends with ``BarrierTimeout`` (its chief went unseen for that long;
        the message says why); one that never reached Redis at all (a wrong URL, a
        server that is down) ends with ``RedisUnavailable``.
        """
        overall = self.deadline is not None and self.deadline <= self._stall_at()
        if overall and self.deadline is not None:
            limit = f"overall timeout ({self.deadline - self.started:g} s)"
        else:
            limit = f"stall timeout ({self.config.stall_timeout:g} s)"
        age = None if self.heartbeat_age is None else max(0.0, self.clock() - self.last_alive)
        seen = "none" if self.last_step is None else str(self.last_step)
        message = (
            f"job {self.config.job}: gave up waiting for step {self.target}: {exc}; retried "
            f"until the {limit}; last step seen {seen}, chief heartbeat "
            + ("never seen" if age is None else f"{age:.1f} s old")
        )
        job, target, last = self.config.job, self.target, self.last_step
        if self.start_ms is None:
            return RedisUnavailable(
                message, job=job, target=target, last_step=last, heartbeat_age=age
            )
        return BarrierTimeout(
            message, job=job, target=target, last_step=last, heartbeat_age=age, stalled=not overall
        )

    def _aborted(self, reason: str) -> BarrierAborted:
        what = "finished" if reason == "done" else "was reset"
        seen = "none" if self.last_step is None else str(self.last_step)
        return BarrierAborted(
            f"job {self.config.job} {what} before step {self.target} came (last step {seen})",
            job=self.config.job,
            target=self.target,
            last_step=self.last_step,
            heartbeat_age=self.heartbeat_age,
            reason=reason,
        )

    def _close_pubsub(self) -> None:
        pubsub, self.pubsub = self.pubsub, None
        if pubsub is not None:
            pubsub.close()

    def leave(self) -> None:
        """Unregister (one quick try: an entry left behind expires by itself)."""
        # Unregister before closing the subscription: the pool hands out its
        # most recently released connection first, and a closed subscription's
        # connection would have to reconnect (TCP handshake, HELLO) on a
        # released worker's critical path.
        try:
            self.link.leave()
        except Exception as exc:
            log.debug("job %s: could not unregister (%s); it expires", self.config.job, exc)
        finally:
            self._close_pubsub()
