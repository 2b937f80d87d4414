"""A Prometheus exporter of every job on a Redis (``stepbarrier exporter``).

It serves the Prometheus text format on ``/metrics`` and reads Redis when it
is scraped, at most once every ``MIN_READ_INTERVAL`` seconds (several
Prometheus servers scraping it cost one read), through
``stepbarrier._inspect.listing``: it needs only the ``monitor`` ACL user. Each job
is one series per gauge, labelled ``job_name``: never ``job``, which is
Prometheus's own target label (a clash would rename ours ``exported_job``),
and no per-worker series but the bounded task gauges below. While Redis is
gone it goes on serving, with ``stepbarrier_up 0`` and no job series (and
``stepbarrier_redis_busy 1`` while Redis answers BUSY).

Each task's progress (issue 38, docs/who-is-slow.md): ``stepbarrier_task_step``,
``stepbarrier_task_behind`` and ``stepbarrier_task_stuck``, labelled
``job_name`` and ``task``, for the tasks that report their progress. Bounded: a
reading reads the tasks of at most ``EXPORTED_TASK_JOBS`` jobs (the first of
the listing), and exports at most ``EXPORTED_TASKS`` tasks of each (the stuck
first, then the most behind), so at most 50 x 100 series per gauge, whatever
the tasks wrote. A task is stuck by the exporter's own stall timeout
(``STEPBARRIER_STALL_TIMEOUT``, 600 s by default).

Fair to each team (issue 34): it exports the jobs of one or more patterns, one
per team (``--job 'team-a-*' --job 'team-b-*'``; ``*`` by default), each with
its fair share of the ``EXPORTED_JOBS`` one reading reads, so one team's jobs,
however many its chief made, never push another team's out of the metrics. A
reading reads at most that many jobs and makes at most ``SCRAPE_SCAN_CALLS``
``SCAN`` calls per master, so it ends well within Prometheus's scrape timeout
whatever the keyspace holds; a pattern whose jobs were not all exported has
``stepbarrier_jobs_truncated{pattern} 1`` (and an alert).

Needs the ``exporter`` extra (``pip install 'stepbarrier[exporter]'``), which
this module imports only when an exporter is made: without it, ``serve`` and
``JobsCollector`` raise an ``ImportError`` that names the extra. The core
never imports this module; the command line does, for its defaults.

Example:
    A ``BarrierConfig``'s job is ignored here: the exporter covers every job:

    ```python
    config = BarrierConfig(job="any", redis_url="redis://redis:6379/0",
                           redis_username="monitor", redis_password=secret)
    with serve(config, port=9464) as server:
        print(server.url)  # http://127.0.0.1:9464/metrics
        threading.Event().wait()
    ```
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIServer

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.listing import (
    LISTING_WAITERS,
    MAX_JOBS,
    JobListing,
    JobSummary,
    PatternListing,
    list_jobs,
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

DEFAULT_PORT = 9464
"""The exporter's port (9464: the port OpenTelemetry's Prometheus exporters use)."""
DEFAULT_BIND = "127.0.0.1"
"""The address it listens on: loopback unless told otherwise (``--bind 0.0.0.0``)."""
MIN_READ_INTERVAL = 2.0
"""Seconds a reading of Redis is served again before the next scrape reads anew."""
READ_RETRY_SECONDS = 1.0
"""How long one reading retries an unreachable Redis: a scrape must end well
within Prometheus's scrape timeout (10 s by default)."""
EXPORTED_JOBS = 5_000
"""Most jobs one reading reads (``--max-jobs``), shared fairly among the patterns:
a few seconds of reading on a small host, within the scrape timeout."""
SCRAPE_SCAN_CALLS = 2_000
"""Most ``SCAN`` calls of one reading, per master (2 million keys looked at); a
larger keyspace leaves every pattern truncated."""

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
"""The per-job gauges (label ``job_name``): help text, and the value of a job
(``None``: no series for that job)."""
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
"""The per-task gauges (labels ``job_name`` and ``task``): help text, and the value
of a task. At most ``EXPORTED_TASKS`` tasks of at most ``EXPORTED_TASK_JOBS`` jobs."""
EXPORTED_TASK_JOBS = 50
"""Most jobs whose tasks one reading reads (the first of the listing)."""
EXPORTED_TASKS = 100
"""Most tasks exported per job: the stuck first, then the most behind."""
SERVER_GAUGES = {
    "stepbarrier_up": "1 when the last reading of Redis succeeded, else 0.",
    "stepbarrier_redis_busy": (
        "1 when the last reading failed because Redis answered BUSY (a script has run past "
        "busy-reply-threshold: FUNCTION KILL or SCRIPT KILL end it), else 0."
    ),
    "stepbarrier_jobs": "Jobs exported by the last reading (absent while it fails).",
    "stepbarrier_scrape_duration_seconds": "Seconds the last reading of Redis took.",
}
"""The gauges without labels, about the exporter's reading of Redis."""
PATTERN_GAUGES: dict[str, tuple[str, Callable[[PatternListing], float]]] = {
    "stepbarrier_jobs_found": (
        "Jobs the last reading's scan found whose names match the pattern (a team's), "
        "each counted for the first pattern it matches.",
        lambda p: p.found,
    ),
    "stepbarrier_jobs_truncated": (
        "1 when some of the pattern's jobs are not exported: more than its fair share of "
        "the jobs one reading reads, or the scan stopped at its bound; else 0.",
        lambda p: int(p.truncated),
    ),
}
"""The per-pattern gauges (label ``pattern``, a team's jobs pattern): help text,
and the value of a pattern (absent while a reading fails)."""
METRIC_NAMES = (
    frozenset(JOB_GAUGES)
    | frozenset(SERVER_GAUGES)
    | frozenset(PATTERN_GAUGES)
    | frozenset(TASK_GAUGES)
)
"""Every metric the exporter serves."""


@dataclass(frozen=True)
class Reading:
    """One reading of Redis.

    Attributes:
        taken_at: When it was taken (the collector's monotonic clock).
        duration: Seconds it took.
        listing: The jobs, or ``None`` if Redis could not be read.
        busy: Redis could not be read because it answered BUSY (a script running).
        tasks: Each job's exported tasks (``EXPORTED_TASKS`` at most), for the
            first ``EXPORTED_TASK_JOBS`` jobs (``None``: not read).
    """

    taken_at: float
    duration: float
    listing: JobListing | None
    busy: bool = False
    tasks: dict[str, tuple[TaskProgress, ...]] | None = None


def require_prometheus_client() -> None:
    """Import prometheus-client, or raise an ``ImportError`` naming the extra that has it."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError as exc:
        if exc.name is None or exc.name.partition(".")[0] != "prometheus_client":
            raise
        raise ImportError(
            "the stepbarrier exporter needs prometheus-client: "
            f"pip install 'stepbarrier[exporter]' ({exc})",
            name=exc.name,
        ) from exc


class JobsCollector:
    """A prometheus-client collector that reads the jobs when it is collected.

    Register it in a ``CollectorRegistry`` (``serve`` does), or in your own.

    Args:
        config: Where Redis is and who to be (its job is ignored).
        pattern: The jobs to export: a name, or a glob such as ``team-a-*``
            (if ``patterns`` is not given).
        patterns: The teams' patterns: each gets its fair share of ``max_jobs``.
        min_interval: Seconds a reading is served again before a new one.
        read: Reads the jobs of the patterns (``list_jobs``; injectable for tests).
        clock: Monotonic clock (injectable for tests).
        max_jobs: Most jobs one reading reads (``EXPORTED_JOBS``).

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
        require_prometheus_client()
        if not 1 <= max_jobs <= MAX_JOBS:
            raise ConfigurationError(
                f"the exporter reads 1 to {MAX_JOBS} jobs per reading, got {max_jobs}",
                variable="max_jobs",
            )
        self.config = config
        self.patterns = validate_patterns((pattern,) if patterns is None else patterns)
        self.min_interval = min_interval
        self._read = read or functools.partial(_read_jobs, max_jobs=max_jobs)
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
        """The last reading if it is recent enough, else a new one."""
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
            if _truncated(listing) != _truncated(last):  # once while it stays, not per scrape
                for part in listing.patterns:
                    if part.truncated:
                        log.warning(
                            "not every job matching %r is exported: %d found, %d read "
                            "(serving stepbarrier_jobs_truncated 1)",
                            part.pattern,
                            part.found,
                            part.read,
                        )
        tasks = None
        if listing is not None and self._read_tasks is not None:
            tasks = self._read_tasks(self.config, [job.job for job in listing.jobs])
        finished = self._clock()
        return Reading(finished, finished - started, listing, busy, tasks)

    def collect(self) -> Iterator[Metric]:
        """The metrics of the current reading (read now if the last one is too old)."""
        from prometheus_client.core import GaugeMetricFamily

        reading = self.reading()
        listing = reading.listing
        yield GaugeMetricFamily(
            "stepbarrier_up", SERVER_GAUGES["stepbarrier_up"], value=int(listing is not None)
        )
        yield GaugeMetricFamily(
            "stepbarrier_redis_busy",
            SERVER_GAUGES["stepbarrier_redis_busy"],
            value=int(reading.busy),
        )
        yield GaugeMetricFamily(
            "stepbarrier_scrape_duration_seconds",
            SERVER_GAUGES["stepbarrier_scrape_duration_seconds"],
            value=reading.duration,
        )
        if listing is None:
            return
        yield GaugeMetricFamily(
            "stepbarrier_jobs", SERVER_GAUGES["stepbarrier_jobs"], value=len(listing.jobs)
        )
        for name, (text, of_pattern) in PATTERN_GAUGES.items():
            patterns = GaugeMetricFamily(name, text, labels=["pattern"])
            for part in listing.patterns:
                patterns.add_metric([part.pattern], float(of_pattern(part)))
            yield patterns
        for name, (text, value_of) in JOB_GAUGES.items():
            family = GaugeMetricFamily(name, text, labels=["job_name"])
            for job in listing.jobs:
                value = value_of(job)
                if value is not None:
                    family.add_metric([job.job], float(value))
            yield family
        for name, (text, of_task) in TASK_GAUGES.items():
            family = GaugeMetricFamily(name, text, labels=["job_name", "task"])
            for job_name, tasks in (reading.tasks or {}).items():
                for task in tasks:
                    value = of_task(task)
                    if value is not None:
                        family.add_metric([job_name, str(task.task_id)], float(value))
            yield family


TaskReader = Callable[[BarrierConfig, list[str]], dict[str, tuple[TaskProgress, ...]]]
"""Reads the tasks of the jobs named (the exporter's ``read_job_tasks``)."""


def read_job_tasks(config: BarrierConfig, jobs: list[str]) -> dict[str, tuple[TaskProgress, ...]]:
    """The exported tasks of the first ``EXPORTED_TASK_JOBS`` of ``jobs``: of each, the
    stuck first, then the most behind, at most ``EXPORTED_TASKS``. Each job's read is
    ``read_status``'s (bounded); a job that cannot be read exports no task, and once
    Redis is unavailable no later job is tried (each try retries for seconds)."""
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
            ordered = sorted(status.tasks, key=lambda t: (not t.stuck, -(t.behind or 0), t.task_id))
            if ordered:
                found[job] = tuple(ordered[:EXPORTED_TASKS])
    finally:
        client.close()
    return found


def _truncated(reading: JobListing | Reading | None) -> frozenset[str]:
    """The patterns a listing (or a reading's) left jobs out of."""
    listing = reading.listing if isinstance(reading, Reading) else reading
    if listing is None:
        return frozenset()
    return frozenset(part.pattern for part in listing.patterns if part.truncated)


def _read_jobs(
    config: BarrierConfig, patterns: tuple[str, ...], *, max_jobs: int = EXPORTED_JOBS
) -> JobListing:
    # a client of its own per reading: a Cluster's slot map is read anew, and
    # no connection outlives an outage
    return list_jobs(
        config,
        patterns=patterns,
        limit=max_jobs,
        scan_calls=SCRAPE_SCAN_CALLS,
        retry_seconds=READ_RETRY_SECONDS,
    )


class MetricsServer:
    """The HTTP server of ``serve``; ``close()`` (or ``with``) stops it."""

    def __init__(
        self, collector: JobsCollector, httpd: WSGIServer, thread: threading.Thread
    ) -> None:
        self.collector = collector
        self._httpd = httpd
        self._thread = thread

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
        """Stop serving and release the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
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
    """Serve the jobs' metrics on ``http://bind:port/metrics``, on a thread of its own.

    Args:
        config: Where Redis is and who to be (the ``monitor`` user is enough).
        port: The port (0: any free one; see ``MetricsServer.port``).
        bind: The address to listen on.
        pattern: The jobs to export: a name, or a glob such as ``team-a-*``
            (if ``patterns`` is not given).
        min_interval: Seconds a reading of Redis is served again.
        patterns: The teams' patterns, e.g. ``("team-a-*", "team-b-*")``: each
            gets its fair share of ``max_jobs``.
        max_jobs: Most jobs one reading reads.

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
    return MetricsServer(collector, httpd, thread)
