"""Helpers of the tests of ``stepbarrier jobs`` and the exporter: live jobs on a real
Redis (a chief that publishes, workers that wait in threads) and a parser of
the exporter's text format."""

from __future__ import annotations

import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from stepbarrier import BarrierConfig, StepPublisher, StepWaiter, read_status


def prefix(name: str) -> str:
    """A job-name prefix of this test alone: the session's Redis holds every test's jobs."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


class Waiting:
    """A worker waiting in a thread until its step, the job's end or its timeout."""

    def __init__(self, config: BarrierConfig, target: int, timeout: float = 60.0) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(config, target, timeout))
        self.thread.daemon = True
        self.thread.start()

    def _run(self, config: BarrierConfig, target: int, timeout: float) -> None:
        try:
            with StepWaiter(config) as waiter:
                waiter.wait(target, timeout=timeout)
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float = 60.0) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the wait did not end"


def eventually(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    """Poll ``predicate`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.05)


@contextmanager
def live_job(
    config: BarrierConfig,
    step: int,
    waits: tuple[int, ...] = (),
    *,
    done: bool = False,
    worker: BarrierConfig | None = None,
) -> Iterator[StepPublisher]:
    """A chief at ``step`` with workers waiting for ``waits`` (as ``worker``, by
    default with the chief's settings); on exit the chief publishes past them
    (or ends the job) and every wait ends."""
    chief = StepPublisher(config)
    waiting: list[Waiting] = []
    worker = worker or config
    try:
        chief.publish(step)
        assert chief.flush(10)
        waiting = [Waiting(worker, target) for target in waits]
        eventually(lambda: len(read_status(config).waiters) == len(waits), what="registered")
        if done:
            chief.close(done=True)
        yield chief
    finally:
        if waiting and not done:
            chief.publish(max(waits))
            assert chief.flush(10)
        chief.close(done=False, timeout=2.0)
        for wait in waiting:
            wait.join()


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The exporter's samples by metric name: (labels, value) each."""
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def job_value(samples: dict[str, Any], metric: str, job: str) -> float | None:
    """The value of ``metric`` for ``job``, or ``None`` if it has no series."""
    values = [value for labels, value in samples.get(metric, []) if labels == {"job_name": job}]
    assert len(values) <= 1, values
    return values[0] if values else None
