"""A Prometheus exporter of every job on a Redis (``stepbarrier exporter``;
its metrics, bounds and teams: docs/operations.md#jobs-metrics-and-alerts)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar
from wsgiref.simple_server import WSGIServer

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.listing import (
    LISTING_WAITERS,
    MAX_JOBS,
    JobListing,
    JobSummary,
    PatternListing,
    list_jobs,
    truncation_lines,
    validate_patterns,
)
from stepbarrier._inspect.progress import TaskProgress
from stepbarrier._inspect.status import read_status
from stepbarrier._redis.client import make_client
from stepbarrier._redis.failures import REDIS_ERRORS, RedisBusy
from stepbarrier.errors import ConfigurationError, RedisRefused, RedisUnavailable

if TYPE_CHECKING:
    from prometheus_client.core import Metric


log = logging.getLogger("stepbarrier.exporter")
T = TypeVar("T")

DEFAULT_PORT = 9464
"""The exporter's port (9464: the port OpenTelemetry's Prometheus exporters use)."""
DEFAULT_BIND = "127.0.0.1"
"""The address it listens on: loopback unless told otherwise (``--bind 0.0.0.0``)."""
MIN_READ_INTERVAL = 2.0
"""Seconds a reading of Redis is served again (to several Prometheus servers too)."""
READ_RETRY_SECONDS = 1.0
"""How long one reading retries an unreachable Redis: a scrape must end well
within Prometheus's scrape timeout (10 s by default)."""
EXPORTED_JOBS = 5_000
"""Most jobs one reading reads (``--max-jobs``), shared fairly among the patterns:
a few seconds of reading on a small host, within the scrape timeout."""
SCRAPE_SCAN_CALLS = 2_000
"""Most ``SCAN`` calls of one reading, per master (2 million keys looked at); a
larger keyspace leaves every pattern truncated (an indexed one's indexed jobs all
exported still)."""

JOB_GAUGES: dict[str, tuple[str, Callable[[JobSummary], float | None]]] = {
    "stepbarrier_step": ("The chief's stored global step.", lambda j: j.step),
    "stepbarrier_generation": (
        "The chief generation (incarnation) that wrote the step.",
        lambda j: j.generation,
    ),
    "stepbarrier_done": ("1 once the chief has closed the job, else 0.", lambda j: int(j.done)),
    "stepbarrier_heartbeat_age_seconds": (
        "Seconds since the chief's last write, by Redis's clock (absent: no chief yet).",
        lambda j: j.heartbeat_age,
    ),
    "stepbarrier_waiting_workers": (
        "Workers registered as waiting, as they report themselves (anyone with a worker's "
        f"password may add entries; at most {LISTING_WAITERS} counted per job).",
        lambda j: j.waiting_workers,
    ),
    "stepbarrier_oldest_wait_seconds": (
        "Seconds the longest-waiting worker has waited (0: none waits).",
        lambda j: j.oldest_wait or 0.0,
    ),
    "stepbarrier_next_wait_until_step": (
        "The lowest step a worker waits for (absent when none waits).",
        lambda j: j.next_wait_until_step,
    ),
    "stepbarrier_problems": (
        "Malformed entries in the job's keys, or 1 if this user may not read them.",
        lambda j: len(j.problems),
    ),
}
"""The per-job gauges: help text, and a job's value (``None``: no series). Their label
is ``job_name``: ``job`` is Prometheus's own (a clash would rename ours ``exported_job``)."""
TASK_GAUGES: dict[str, tuple[str, Callable[[TaskProgress], float | None]]] = {
    "stepbarrier_task_step": (
        "The step a task last reported (ProgressReporter, the hooks and callbacks).",
        lambda t: t.step,
    ),
    "stepbarrier_task_behind": (
        "Steps the task is behind the chief's stored step (absent before the chief stored one).",
        lambda t: t.behind,
    ),
    "stepbarrier_task_stuck": (
        "1 when the task is stuck: behind the chief, no progress for the exporter's stall "
        "timeout while the chief advanced; else 0.",
        lambda t: int(t.stuck),
    ),
}
EXPORTED_TASK_JOBS = 50
"""Most jobs whose tasks one reading reads (the first of the listing)."""
EXPORTED_TASKS = 100
"""Most tasks exported per job (``JobStatus.tasks_by_concern``: the stuck first)."""
SERVER_GAUGES: dict[str, tuple[str, Callable[[Reading], float | None]]] = {
    "stepbarrier_up": (
        "1 when the last reading of Redis succeeded, else 0.",
        lambda r: int(r.listing is not None),
    ),
    "stepbarrier_redis_busy": (
        "1 when the last reading failed because Redis answered BUSY (a script has run past "
        "busy-reply-threshold: FUNCTION KILL or SCRIPT KILL end it), else 0.",
        lambda r: int(r.busy),
    ),
    "stepbarrier_scrape_duration_seconds": (
        "Seconds the last reading of Redis took.",
        lambda r: r.duration,
    ),
    "stepbarrier_jobs": (
        "Jobs exported by the last reading (absent while it fails).",
        lambda r: None if r.listing is None else len(r.listing.jobs),
    ),
}
PATTERN_GAUGES: dict[str, tuple[str, Callable[[PatternListing], float | None]]] = {
    "stepbarrier_jobs_found": (
        "Jobs the last reading found whose names match the pattern (a team's): the "
        "members of its job index and those its scan found, each counted for the first "
        "pattern it matches.",
        lambda p: p.found,
    ),
    "stepbarrier_jobs_truncated": (
        "1 when some of the pattern's jobs are (or may be) not exported: more than its fair "
        "share of the jobs one reading reads, a job index longer than one read, or the "
        "scan stopped at its bound (a job index's jobs are all exported still); else 0.",
        lambda p: int(p.truncated),
    ),
    "stepbarrier_jobs_indexed": (
        "1 when the pattern has a job index (its chiefs set STEPBARRIER_JOBS_PATTERN to "
        "it), whose jobs no scan of the keyspace can miss; 0 when only the scan finds its jobs.",
        lambda p: int(p.indexed),
    ),
}
METRIC_NAMES = frozenset([*JOB_GAUGES, *SERVER_GAUGES, *PATTERN_GAUGES, *TASK_GAUGES])


@dataclass(frozen=True)
class Reading:
    """One reading of Redis, ``taken_at`` by the collector's clock: ``listing`` is
    ``None`` if Redis could not be read (``busy``: it answered BUSY), ``tasks`` if
    they were not read (else ``read_job_tasks``'s)."""

    taken_at: float
    duration: float
    listing: JobListing | None
    busy: bool = False
    tasks: dict[str, tuple[TaskProgress, ...]] | None = None


class JobsCollector:
    """A prometheus-client collector that reads the jobs when it is collected.

    ``config``'s job is ignored; ``pattern``/``patterns`` are ``list_jobs``'s,
    ``max_jobs`` its ``limit``; ``read``, ``read_tasks`` and ``clock`` are
    injectable for tests (``list_jobs``, ``read_job_tasks``, ``time.monotonic``).

    Raises:
        ConfigurationError: An invalid pattern, or ``max_jobs`` out of range.
    """

    def __init__(
        self,
        config: BarrierConfig,
        *,
        pattern: str = "*",
        patterns: Sequence[str] | None = None,
        min_interval: float = MIN_READ_INTERVAL,
        read: Callable[[BarrierConfig, tuple[str, ...]], JobListing] | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_jobs: int = EXPORTED_JOBS,
        read_tasks: TaskReader | None = None,
    ) -> None:
        try:
            import prometheus_client  # noqa: F401
        except ImportError as exc:  # name the extra that has it
            if exc.name is None or exc.name.partition(".")[0] != "prometheus_client":
                raise
            raise ImportError(
                "the stepbarrier exporter needs prometheus-client: "
                f"pip install 'stepbarrier[exporter]' ({exc})",
                name=exc.name,
            ) from exc
        if not 1 <= max_jobs <= MAX_JOBS:
            raise ConfigurationError(
                f"the exporter reads 1 to {MAX_JOBS} jobs per reading, got {max_jobs}",
                variable="max_jobs",
            )
        self.config = config
        self.patterns = validate_patterns((pattern,) if patterns is None else patterns)
        self.min_interval = min_interval
        # a client of its own per reading: a Cluster's slot map is read anew, and
        # no connection outlives an outage
        self._read = read or (
            lambda config, patterns: list_jobs(
                config,
                patterns=patterns,
                limit=max_jobs,
                scan_calls=SCRAPE_SCAN_CALLS,
                retry_seconds=READ_RETRY_SECONDS,
            )
        )
        # the tasks' progress: read with the default reading (a test's own
        # reading of jobs brings its own, or none)
        self._read_tasks = read_tasks if read_tasks is not None or read else read_job_tasks
        self._clock = clock
        self._lock = threading.Lock()  # scrapes are served on threads of their own
        self._last: Reading | None = None

    def describe(self) -> Iterable[Metric]:
        """Nothing: registering the collector must not read Redis."""
        return []

    def reading(self) -> Reading:
        """The last reading if it is recent enough (``min_interval``), else a new one."""
        with self._lock:
            last = self._last
            if last is None or self._clock() - last.taken_at >= self.min_interval:
                last = self._last = self._take(last)
            return last

    def _take(self, last: Reading | None) -> Reading:
        started = self._clock()
        listing: JobListing | None
        busy = False
        try:
            listing = self._read(self.config, self.patterns)
        except (RedisUnavailable, RedisRefused) as exc:
            busy = isinstance(exc, RedisBusy)
            if last is None or last.listing is not None or last.busy != busy:
                # once per outage (or change of its kind), not per scrape
                log.warning("cannot read the jobs (serving stepbarrier_up 0): %s", exc)
            listing = None
        else:
            if last is not None and last.listing is None:
                log.warning("reading the jobs again (serving stepbarrier_up 1)")
            was = set() if last is None or last.listing is None else _truncated(last.listing)
            if _truncated(listing) != was:  # once while it stays, not per scrape
                for line in truncation_lines(listing):
                    log.warning("%s (serving stepbarrier_jobs_truncated 1)", line)
        tasks = None
        if listing is not None and self._read_tasks is not None:
            tasks = self._read_tasks(self.config, [job.job for job in listing.jobs])
        finished = self._clock()
        return Reading(finished, finished - started, listing, busy, tasks)

    def collect(self) -> Iterator[Metric]:
        """The metrics of the current reading (read now if the last one is too old)."""
        reading = self.reading()
        yield from _families(SERVER_GAUGES, [], [((), reading)])
        listing = reading.listing
        if listing is None:
            return
        yield from _families(
            PATTERN_GAUGES, ["pattern"], [((p.pattern,), p) for p in listing.patterns]
        )
        yield from _families(JOB_GAUGES, ["job_name"], [((j.job,), j) for j in listing.jobs])
        tasks = [
            ((job, str(task.task_id)), task)
            for job, ordered in (reading.tasks or {}).items()
            for task in ordered
        ]
        yield from _families(TASK_GAUGES, ["job_name", "task"], tasks)


def _families(
    gauges: dict[str, tuple[str, Callable[[T], float | None]]],
    labels: list[str],
    rows: Sequence[tuple[tuple[str, ...], T]],
) -> Iterator[Metric]:
    """A family per gauge, a series per row whose value is not ``None``; a family
    without labels is left out when it has no series."""
    from prometheus_client.core import GaugeMetricFamily

    for name, (text, value_of) in gauges.items():
        family = GaugeMetricFamily(name, text, labels=labels)
        for label_values, row in rows:
            value = value_of(row)
            if value is not None:
                family.add_metric(list(label_values), float(value))
        if labels or family.samples:
            yield family


TaskReader = Callable[[BarrierConfig, list[str]], dict[str, tuple[TaskProgress, ...]]]


def read_job_tasks(config: BarrierConfig, jobs: list[str]) -> dict[str, tuple[TaskProgress, ...]]:
    """The exported tasks (``EXPORTED_TASKS``, by concern) of the first
    ``EXPORTED_TASK_JOBS`` of ``jobs``, each read by ``read_status``; a job that cannot
    be read exports no task."""
    found: dict[str, tuple[TaskProgress, ...]] = {}
    selected = jobs[:EXPORTED_TASK_JOBS]
    if not selected:
        return found
    try:
        client = make_client(config)
    except (RedisUnavailable, RedisRefused, *REDIS_ERRORS) as exc:
        log.info("cannot read the tasks' progress: %s", exc)
        return found
    try:
        for job in selected:
            try:
                status = read_status(
                    replace(config, job=job), client, waiters=False, barriers=False
                )
            except RedisUnavailable as exc:
                # Redis went away (each job's read retries for seconds): the
                # rest would wait as long, each, under the collector's lock
                log.info("tasks' progress not exported (Redis unavailable): %s", exc)
                break
            except (RedisRefused, ConfigurationError) as exc:
                log.debug("job %s: tasks not exported: %s", job, exc)
                continue
            if status.tasks:
                found[job] = status.tasks_by_concern[:EXPORTED_TASKS]
    finally:
        client.close()
    return found


def _truncated(listing: JobListing) -> set[str]:
    return {part.pattern for part in listing.patterns if part.truncated}


@dataclass
class MetricsServer(AbstractContextManager["MetricsServer"]):
    """The HTTP server of ``serve``; ``close()`` (or ``with``) stops it."""

    _httpd: WSGIServer
    _thread: threading.Thread

    @property
    def port(self) -> int:
        """The port it listens on (the one the system chose for port 0)."""
        return int(self._httpd.server_port)

    @property
    def url(self) -> str:
        """Where the metrics are, e.g. ``http://127.0.0.1:9464/metrics``."""
        host = str(self._httpd.server_address[0])
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/metrics"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def serve(
    config: BarrierConfig,
    *,
    port: int = DEFAULT_PORT,
    bind: str = DEFAULT_BIND,
    pattern: str = "*",
    min_interval: float = MIN_READ_INTERVAL,
    patterns: Sequence[str] | None = None,
    max_jobs: int = EXPORTED_JOBS,
) -> MetricsServer:
    """Serve the jobs' metrics on ``http://bind:port/metrics`` (``port`` 0: any free
    one), on a thread of its own; the other arguments are ``JobsCollector``'s.

    Raises:
        ConfigurationError: An invalid pattern, or ``max_jobs`` out of range.
        ImportError: prometheus-client is not installed (the ``exporter`` extra).
        OSError: The address cannot be listened on (in use, not this host's).
    """
    collector = JobsCollector(
        config, pattern=pattern, patterns=patterns, min_interval=min_interval, max_jobs=max_jobs
    )
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    httpd, thread = start_http_server(port, addr=bind, registry=registry)
    return MetricsServer(httpd, thread)
