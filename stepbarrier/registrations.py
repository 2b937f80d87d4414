"""The chief's ear for new waiters: a thread blocked on the job's registrations list.

A registering waiter pushes its target onto ``stepbarrier:{job}:registrations``;
this thread's ``BLPOP`` returns at once and hands the target to the publisher,
so a step a worker waits for is announced the moment it is crossed, even if
the worker registered after the chief's last write. Idle, it sends one command
every ``REGISTRATION_BLOCK`` seconds. Losing it costs nothing but speed: every
write of the publisher also returns the pending targets.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from stepbarrier.config import BarrierConfig
from stepbarrier.connection import (
    RedisClient,
    backoff,
    backoff_attempt,
    disconnect_all,
    is_transient,
    make_client,
    refresh_topology,
    translate,
)
from stepbarrier.protocol import parse_int

log = logging.getLogger("stepbarrier.registrations")

REGISTRATION_BLOCK = 30
"""Seconds one BLPOP blocks; a new waiter ends it at once."""
LOG_EVERY = 60.0
"""Seconds between repeated log lines about the listener's failures."""


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
                    item = self._connected().blpop([key], timeout=REGISTRATION_BLOCK)
                    failures = 0
                except Exception as exc:
                    if self._stopping.is_set():
                        break
                    failures += 1
                    if self._client is not None:
                        refresh_topology(self._client)
                    if time.monotonic() - last_log >= LOG_EVERY:
                        last_log = time.monotonic()
                        error = translate(exc, self._config, action="hear new waiters")
                        log.warning(
                            "%s; new waiters are heard at the chief's next write instead",
                            str(error).rstrip("."),
                        )
                    # a refusal (ACL, password) will not pass by retrying soon
                    transient = is_transient(exc)
                    delay = wait(backoff_attempt(failures)) if transient else REGISTRATION_BLOCK
                    self._stopping.wait(delay)
                    continue
                if item is None:
                    continue
                target = parse_int(item[1], low=1)
                if target is None:
                    log.debug("ignored a malformed registration %r", item[1][:40])
                    continue
                self._on_target(target)
        finally:
            with self._client_lock:
                if self._client is not None:
                    self._client.close()

    def _connected(self) -> RedisClient:
        with self._client_lock:
            if self._client is None:
                self._client = make_client(self._config, socket_timeout=REGISTRATION_BLOCK + 10)
            return self._client
