"""The chief's ear for new waiters: a thread blocked on the job's registrations list.

A registering waiter pushes its target onto ``stepbarrier:{job}:registrations``;
this thread's ``BLPOP`` returns at once and hands the target to the publisher,
so a step a worker waits for is announced the moment it is crossed, even if
the worker registered after the chief's last write. Idle, it sends one command
every ``REGISTRATION_BLOCK`` seconds. Losing it costs nothing but speed: every
write of the publisher also returns the pending targets.

Bounded work: anyone who may register may also push onto the list by hand, as
fast as it likes. Each wake (a ``BLPOP`` that returned) takes at most
``REGISTRATION_BATCH`` entries (the rest of them by one ``LPOP`` with a count),
parses each once, drops the duplicates, and hands over only the
``REPORT_PER_WAKE`` lowest targets: the publisher needs the lowest target above
its step, and a late joiner's (at or below it) makes it write at once, which
also brings back the pending targets from the index. So a flood of the list
costs the chief work linear in the entries, and bounded per wake.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
import time
from collections.abc import Callable

import redis

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.wire import parse_int
from stepbarrier._redis.client import RedisClient, disconnect_all, make_client, refresh_topology
from stepbarrier._redis.failures import is_transient, translate
from stepbarrier._redis.retries import backoff, backoff_attempt

log = logging.getLogger("stepbarrier._chief.registrations")

REGISTRATION_BLOCK = 30
"""Seconds one BLPOP blocks; a new waiter ends it at once."""
LOG_EVERY = 60.0
"""Seconds between repeated log lines about the listener's failures."""
REGISTRATION_BATCH = 1000
"""Most registrations one wake takes off the list."""
REPORT_PER_WAKE = 32
"""Most targets one wake hands to the publisher (the lowest, without duplicates)."""


class RegistrationListener:
    """Calls ``on_target(step)`` for every target a new waiter registers.

    Args:
        config: The job's settings.
        on_target: Called from the listener's thread with each valid target.
    """

    def __init__(self, config: BarrierConfig, on_target: Callable[[int], None]) -> None:
        self._config = config
        self._on_target = on_target
        # made in the thread (a cluster client reads the slot map at once, and
        # Redis may be down); the lock lets stop() always find it to cut a BLPOP
        self._client: RedisClient | None = None
        self._client_lock = threading.Lock()
        self._stopping = threading.Event()
        self._batches = True  # False once the server refused LPOP with a count
        self._thread = threading.Thread(
            target=self._run, name=f"stepbarrier-registrations-{config.job}", daemon=True
        )

    def start(self) -> None:
        """Start listening (in a daemon thread)."""
        self._thread.start()

    def is_alive(self) -> bool:
        """True while the thread runs."""
        return self._thread.is_alive()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop listening; a BLPOP in progress is cut short by closing its socket.

        The socket is closed again until the thread has gone, so a BLPOP that
        started just after a close cannot outlive ``stop`` by its 30 s block.
        """
        self._stopping.set()
        deadline = time.monotonic() + timeout
        while True:
            with self._client_lock:
                if self._client is not None:
                    disconnect_all(self._client)
            remaining = deadline - time.monotonic()
            if not self._thread.is_alive() or remaining <= 0:
                return
            self._thread.join(min(remaining, 0.05))

    def _run(self) -> None:
        wait = backoff()
        failures = 0
        last_log = -math.inf
        key = self._config.keys.registrations
        try:
            while not self._stopping.is_set():
                try:
                    items = self._take(key)
                    failures = 0
                except Exception as exc:
                    if self._stopping.is_set():
                        break
                    failures += 1
                    if self._client is not None:
                        refresh_topology(self._client)
                    if time.monotonic() - last_log >= LOG_EVERY:
                        last_log = time.monotonic()
                        error = translate(exc, self._config, action="hear new waiters", probe=False)
                        log.warning(
                            "%s; new waiters are heard at the chief's next write instead",
                            str(error).rstrip("."),
                        )
                    # a refusal (ACL, password) will not pass by retrying soon
                    transient = is_transient(exc)
                    delay = wait(backoff_attempt(failures)) if transient else REGISTRATION_BLOCK
                    self._stopping.wait(delay)
                    continue
                for target in lowest_targets(items):
                    self._on_target(target)
        finally:
            with self._client_lock:
                if self._client is not None:
                    self._client.close()

    def _take(self, key: str) -> list[object]:
        """One wake: block until a registration comes, then take up to a batch of them."""
        client = self._connected()
        item = client.blpop([key], timeout=REGISTRATION_BLOCK)
        if item is None:
            return []
        items: list[object] = [item[1]]
        if self._batches:
            try:
                more = client.lpop(key, REGISTRATION_BATCH - 1)
            except redis.ResponseError as exc:
                if not str(exc).startswith("WRONGTYPE"):
                    # LPOP with a count needs Redis 6.2 or later and the chief's
                    # +lpop (users.acl of this version): else one a wake, as before
                    log.debug("registrations taken one at a time: %s", exc)
                    self._batches = False
            except redis.RedisError:
                pass  # the next BLPOP meets the failure; keep what was taken
            else:
                if isinstance(more, list):
                    items += more
        return items

    def _connected(self) -> RedisClient:
        with self._client_lock:
            if self._client is None:
                self._client = make_client(self._config, socket_timeout=REGISTRATION_BLOCK + 10)
            return self._client


def lowest_targets(items: list[object]) -> list[int]:
    """The valid targets among ``items``, without duplicates, the lowest
    ``REPORT_PER_WAKE`` of them, in increasing order (linear in ``items``)."""
    targets: set[int] = set()
    malformed = 0
    for raw in items:
        target = parse_int(raw, low=1)
        if target is None:
            malformed += 1
        else:
            targets.add(target)
    if malformed:
        log.debug("ignored %d malformed registration(s)", malformed)
    return heapq.nsmallest(REPORT_PER_WAKE, targets)
