"""The one place that reads ``STEPBARRIER_*`` variables and ``TF_CONFIG``.

``BarrierConfig.from_env`` builds its configuration of ``settings_from_env``, and
``hooks_from_env`` and ``callbacks_from_env`` first ask ``barrier_role_from_env``;
nothing else in the library looks at the environment. When
``STEPBARRIER_RUN_ID`` is not set, the run id is the launcher's own
(torchrun's, Slurm's): ``run_id_from_env``; when neither ``STEPBARRIER_TASK_ID``
nor ``TF_CONFIG`` gives the task id, it is the launcher's rank (torchrun's
``RANK``, Slurm's ``SLURM_PROCID``), and rank 0 the chief: ``task_from_env``.
Each variable is parsed here and checked again by ``BarrierConfig``; an error
names the variable and what was expected, and never contains a secret. This module builds no
``BarrierConfig`` itself: ``stepbarrier._config.settings`` depends on it, not the reverse.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import stat
from collections.abc import Mapping
from typing import NamedTuple, TypedDict

from stepbarrier._config.checks import (
    DURATION_EXAMPLES,
    check_url,
    mask_url,
    parse_duration,
    validate_job,
    validate_run_id,
)
from stepbarrier._config.defaults import (
    DEFAULT_DONE_TTL,
    DEFAULT_HEARTBEAT,
    DEFAULT_KEY_TTL,
    DEFAULT_NO_CHIEF_WARNING,
    DEFAULT_REDIS_URL,
    DEFAULT_SENTINEL_SERVICE,
    DEFAULT_STALL_TIMEOUT,
    LAUNCHER_RANKS,
    MAX_REPORT_EVERY,
    OnTimeout,
    Role,
    RunIdSource,
    TaskIdSource,
)
from stepbarrier._config.schedule import validate_schedule
from stepbarrier._config.tf_config import (
    MAX_TASK_ID,
    NO_ROLE_TASK_TYPES,
    task_from_tf_config,
    trainer_count,
)
from stepbarrier._protocol.barrier_record import validate_parties
from stepbarrier._protocol.freshness import MAX_HEARTBEAT
from stepbarrier._protocol.wire import MAX_STEP, RUN_ID
from stepbarrier.errors import ConfigurationError


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def job_in_env(environ: Mapping[str, str] | None = None) -> bool:
    """True if ``STEPBARRIER_JOB`` is set (to anything but blanks): stepbarrier is
    configured on this host (``GlobalStepWaiterHook`` without it waits as
    TensorFlow's hook does)."""
    return _get(os.environ if environ is None else environ, "STEPBARRIER_JOB") is not None


def barrier_role_from_env(environ: Mapping[str, str] | None = None) -> Role | None:
    """This host's barrier role, before anything else is read or checked.

    ``hooks_from_env`` and ``callbacks_from_env`` ask this first, so that a ps or
    evaluator task needs no ``STEPBARRIER_*`` variable at all.

    Args:
        environ: The variables to read; ``os.environ`` when ``None``.

    Returns:
        ``"chief"`` or ``"worker"``; ``None`` for a ps or evaluator task of
        ``TF_CONFIG`` (unless ``STEPBARRIER_ROLE`` gives it a role).

    Raises:
        ConfigurationError: No role can be found (neither ``STEPBARRIER_ROLE``
            nor a chief or worker task in ``TF_CONFIG``), or a variable the role
            comes from is invalid.
    """
    task = task_from_env(os.environ if environ is None else environ)
    role, tf_type = task.role, task.tf_type
    if role is not None or tf_type in NO_ROLE_TASK_TYPES:
        return role
    how = (
        "set STEPBARRIER_ROLE=chief on the chief, and STEPBARRIER_ROLE=worker with "
        "STEPBARRIER_TASK_ID=N (N >= 1, the chief being task 0) on each worker, or "
        "start the tasks with torchrun or srun (rank 0 is the chief)"
    )
    if tf_type is not None:
        raise ConfigurationError(
            f"TF_CONFIG gives this host the task type {tf_type[:40]!r}, which has no barrier "
            f"role (chief, master and worker have one; ps and evaluator need none): {how}",
            variable="TF_CONFIG",
        )
    raise ConfigurationError(
        "this host has no barrier role: neither STEPBARRIER_ROLE, TF_CONFIG nor a launcher's "
        "rank (torchrun's RANK, Slurm's SLURM_PROCID) says whether it is the chief or a "
        "worker (launchers that pass --job_name/--task_index "
        f"flags set neither): {how}, or set TF_CONFIG to the cluster and this task",
        variable="STEPBARRIER_ROLE",
    )


def barrier_parties_from_env(
    environ: Mapping[str, str] | None = None, parties: int | None = None
) -> int:
    """The parties of the job's start and end barriers: ``parties`` if given, else
    the chief and worker tasks of ``TF_CONFIG``.

    Raises:
        ConfigurationError: Neither says, or ``parties`` is invalid.
    """
    if parties is not None:
        return validate_parties(parties)
    found = trainer_count((os.environ if environ is None else environ).get("TF_CONFIG"))
    if found is None:
        raise ConfigurationError(
            "the start and end barriers need the number of parties (the chief and the "
            "workers): pass parties=N, or set TF_CONFIG to the cluster",
            variable="parties",
        )
    return found


class HostTask(NamedTuple):
    """This host's role and task id, where the task id came from, and the task type
    of ``TF_CONFIG`` if it had to be read (``task_from_env``)."""

    role: Role | None
    task_id: int | None
    task_id_source: TaskIdSource | None
    tf_type: str | None


def task_from_env(environ: Mapping[str, str] | None = None) -> HostTask:
    """This host's barrier role and task id (docs/configuration.md#task-id-and-role).

    The task id is the first of these that gives one:

    1. ``STEPBARRIER_TASK_ID``;
    2. ``STEPBARRIER_ROLE=chief``: task 0;
    3. ``TF_CONFIG``'s task;
    4. torchrun's ``RANK``, only when ``TORCHELASTIC_RUN_ID`` is set too (any
       value: torchrun sets both in every process it starts), so that a ``RANK``
       some other tool left behind is never taken for a task id;
    5. Slurm's ``SLURM_PROCID`` (``srun`` sets it in each task; the batch
       script itself runs as 0).

    The role is ``STEPBARRIER_ROLE``, else ``TF_CONFIG``'s; when neither gives
    one and a launcher's rank is set, it follows the task id in force: task 0
    is the chief, every other a worker. A ``TF_CONFIG`` that names a task type
    without a role (``ps``, ``evaluator``) keeps the host out whatever the
    launcher says. A variable's value is read (and checked) only when those
    before it leave the task id open: a conflict is no error, the earlier one
    wins (a bad ``RANK`` beside ``STEPBARRIER_TASK_ID`` is not even looked at).

    Raises:
        ConfigurationError: A variable that is read is invalid (e.g. ``RANK=abc``);
            the message names it.
    """
    env = os.environ if environ is None else environ
    role = _env_role(env)
    task_id = _env_int(env, "STEPBARRIER_TASK_ID", low=0, high=MAX_TASK_ID)
    source: TaskIdSource | None = "STEPBARRIER_TASK_ID" if task_id is not None else None
    if role == "chief" and task_id is None:
        task_id, source = 0, "STEPBARRIER_ROLE"
    if role is not None and task_id is not None:
        return HostTask(role, task_id, source, None)
    # STEPBARRIER_ROLE and STEPBARRIER_TASK_ID win; TF_CONFIG is read only for
    # what they leave open, so that a TF_CONFIG this library cannot use never
    # blocks them
    tf_task = task_from_tf_config(env.get("TF_CONFIG"))
    if task_id is None and tf_task.task_id is not None:
        task_id, source = tf_task.task_id, "TF_CONFIG"
    role = role or tf_task.role
    if (role is not None and task_id is not None) or tf_task.type is not None:
        return HostTask(role, task_id, source, tf_task.type)
    launcher = _launcher_rank_variable(env)
    if launcher is None:
        return HostTask(role, task_id, source, None)
    if task_id is None:
        # only now is its value needed: an explicit task id leaves it unread
        what = LAUNCHER_RANKS[launcher]
        task_id = _env_int(env, launcher, low=0, high=MAX_TASK_ID, what=what)
        source = launcher
    if role is None:
        role = "chief" if task_id == 0 else "worker"
    return HostTask(role, task_id, source, None)


def _launcher_rank_variable(env: Mapping[str, str]) -> TaskIdSource | None:
    """The launcher's rank variable set in ``env``: torchrun's ``RANK`` (with
    ``TORCHELASTIC_RUN_ID`` set), else Slurm's ``SLURM_PROCID``; ``None`` when
    neither is set (to anything but blanks)."""
    torchrun = env.get("TORCHELASTIC_RUN_ID") is not None
    for name in LAUNCHER_RANKS:
        if name == "RANK" and not torchrun:
            continue  # a RANK without torchrun's id may be anyone's
        if _get(env, name) is not None:
            return name
    return None


def _env_role(env: Mapping[str, str]) -> Role | None:
    text = _get(env, "STEPBARRIER_ROLE")
    if text is None:
        return None
    if text.lower() == "chief":
        return "chief"
    if text.lower() == "worker":
        return "worker"
    raise ConfigurationError(
        f"STEPBARRIER_ROLE must be 'chief' or 'worker', got {text[:40]!r}",
        variable="STEPBARRIER_ROLE",
    )


class EnvSettings(TypedDict):
    """The ``BarrierConfig`` arguments that the environment gives, checked."""

    job: str
    redis_url: str
    redis_username: str | None
    redis_password: str | None
    tls_ca_file: str | None
    tls_cert_file: str | None
    tls_key_file: str | None
    sentinels: tuple[tuple[str, int], ...]
    sentinel_service: str
    role: Role | None
    task_id: int | None
    task_id_source: TaskIdSource | None
    wait_until_step: int | None
    schedule: str | None
    timeout: float | None
    stall_timeout: float
    on_timeout: OnTimeout
    heartbeat: float
    key_ttl: int
    run_id: str | None
    run_id_source: RunIdSource | None
    done_ttl: int
    progress_timeout: float | None
    no_chief_warning: float
    use_eval: bool
    redis_cluster: bool
    tls_insecure: bool
    report_every: int | None
    report_progress: bool


def settings_from_env(env: Mapping[str, str]) -> EnvSettings:
    """The settings that ``env`` (``STEPBARRIER_*`` and ``TF_CONFIG``) describes.

    ``stepbarrier._config.settings.config_from_env`` (and ``BarrierConfig.from_env``) make
    a ``BarrierConfig`` of them.

    Raises:
        ConfigurationError: A variable is missing or invalid; the message names it.
    """
    job = _get(env, "STEPBARRIER_JOB")
    if job is None:
        raise ConfigurationError(
            "STEPBARRIER_JOB is required: name the job, e.g. STEPBARRIER_JOB=mnist-42",
            variable="STEPBARRIER_JOB",
        )
    validate_job(job)
    url = _get(env, "STEPBARRIER_REDIS_URL") or DEFAULT_REDIS_URL
    tls_insecure = _env_flag(env, "STEPBARRIER_TLS_INSECURE")
    check_url(url, "STEPBARRIER_REDIS_URL", tls_insecure=tls_insecure)
    role, task_id, task_id_source, _ = task_from_env(env)
    schedule = _get(env, "STEPBARRIER_SCHEDULE")
    if schedule is not None:
        schedule = validate_schedule(schedule, variable="STEPBARRIER_SCHEDULE")
    on_timeout = (_get(env, "STEPBARRIER_ON_TIMEOUT") or "raise").lower()
    if on_timeout not in ("raise", "proceed"):
        raise ConfigurationError(
            f"STEPBARRIER_ON_TIMEOUT must be 'raise' or 'proceed', got {on_timeout!r}",
            variable="STEPBARRIER_ON_TIMEOUT",
        )
    heartbeat = _env_seconds(env, "STEPBARRIER_HEARTBEAT", high=MAX_HEARTBEAT)
    stall = _env_seconds(env, "STEPBARRIER_STALL_TIMEOUT")
    if stall is not None and stall <= (heartbeat or DEFAULT_HEARTBEAT):
        raise ConfigurationError(
            "STEPBARRIER_STALL_TIMEOUT must be longer than STEPBARRIER_HEARTBEAT "
            f"({heartbeat or DEFAULT_HEARTBEAT:g} s), got {stall:g}",
            variable="STEPBARRIER_STALL_TIMEOUT",
        )
    if heartbeat is not None and stall is None and heartbeat >= DEFAULT_STALL_TIMEOUT:
        raise ConfigurationError(
            f"STEPBARRIER_HEARTBEAT ({heartbeat:g} s) must be shorter than the stall "
            f"timeout ({DEFAULT_STALL_TIMEOUT:g} s); set STEPBARRIER_STALL_TIMEOUT too",
            variable="STEPBARRIER_HEARTBEAT",
        )
    cert = _env_file(env, "STEPBARRIER_TLS_CERT_FILE")
    key = _env_file(env, "STEPBARRIER_TLS_KEY_FILE")
    if (cert is None) != (key is None):
        raise ConfigurationError(
            "STEPBARRIER_TLS_CERT_FILE and STEPBARRIER_TLS_KEY_FILE go together: "
            "set both or neither",
            variable="STEPBARRIER_TLS_CERT_FILE" if key else "STEPBARRIER_TLS_KEY_FILE",
        )
    ca = _env_file(env, "STEPBARRIER_TLS_CA_FILE")
    if (ca or cert) and not url.startswith("rediss://"):
        # never let a TLS setting be silently ignored on a plain connection
        variable = "STEPBARRIER_TLS_CA_FILE" if ca else "STEPBARRIER_TLS_CERT_FILE"
        raise ConfigurationError(
            f"{variable} is set but STEPBARRIER_REDIS_URL is not a rediss:// URL "
            f"({mask_url(url)}); use rediss:// for TLS",
            variable=variable,
        )
    ttl = _env_int(env, "STEPBARRIER_KEY_TTL", low=60, high=10 * 365 * 24 * 3600)
    done_ttl = _env_int(env, "STEPBARRIER_DONE_TTL", low=1, high=10 * 365 * 24 * 3600)
    run_id, run_id_source = run_id_from_env(env)
    return EnvSettings(
        job=job,
        redis_url=url,
        redis_username=_get(env, "STEPBARRIER_REDIS_USERNAME"),
        redis_password=_password(env),
        tls_ca_file=ca,
        tls_cert_file=cert,
        tls_key_file=key,
        sentinels=_sentinels(env),
        sentinel_service=_get(env, "STEPBARRIER_SENTINEL_SERVICE") or DEFAULT_SENTINEL_SERVICE,
        role=role,
        task_id=task_id,
        task_id_source=task_id_source,
        wait_until_step=_env_int(env, "STEPBARRIER_WAIT_UNTIL_STEP", low=0, high=MAX_STEP),
        schedule=schedule,
        timeout=_env_seconds(env, "STEPBARRIER_TIMEOUT"),
        stall_timeout=stall if stall is not None else DEFAULT_STALL_TIMEOUT,
        on_timeout="proceed" if on_timeout == "proceed" else "raise",
        heartbeat=heartbeat if heartbeat is not None else DEFAULT_HEARTBEAT,
        key_ttl=ttl if ttl is not None else DEFAULT_KEY_TTL,
        run_id=run_id,
        run_id_source=run_id_source,
        done_ttl=done_ttl if done_ttl is not None else DEFAULT_DONE_TTL,
        progress_timeout=_env_seconds(env, "STEPBARRIER_PROGRESS_TIMEOUT"),
        no_chief_warning=_env_seconds(env, "STEPBARRIER_NO_CHIEF_WARNING")
        or DEFAULT_NO_CHIEF_WARNING,
        use_eval=_env_flag(env, "STEPBARRIER_USE_EVAL"),
        redis_cluster=_env_flag(env, "STEPBARRIER_REDIS_CLUSTER"),
        tls_insecure=tls_insecure,
        report_every=_env_int(env, "STEPBARRIER_REPORT_EVERY", low=0, high=MAX_REPORT_EVERY),
        # on unless set to 0 (the hooks and callbacks report each task's own step)
        report_progress=_get(env, "STEPBARRIER_REPORT_PROGRESS") is None
        or _env_flag(env, "STEPBARRIER_REPORT_PROGRESS"),
    )


LAUNCHER_ID_KEPT = 40
"""How many characters of a launcher's id a mapped run id keeps (``launcher_run_id``)."""
_NOT_IN_RUN_ID = re.compile(r"[^A-Za-z0-9._-]+")
_COUNT = re.compile(r"[0-9]{1,18}")


def run_id_from_env(
    environ: Mapping[str, str] | None = None,
) -> tuple[str | None, RunIdSource | None]:
    """The run id in force, and the variable it came from (docs/configuration.md#run-id).

    The first of these that is set wins:

    1. ``STEPBARRIER_RUN_ID``: the run id itself; set but empty (or blank) it
       means *no run id*, and no launcher's id is looked at either;
    2. ``TORCHELASTIC_RUN_ID`` (torchrun's ``--rdzv-id``), unless ``none``,
       which torchrun sets when no id was given;
    3. ``SLURM_JOB_ID``, as ``slurm-<id>``, with ``-r<n>`` appended when
       ``SLURM_RESTART_COUNT`` is above 0: a requeued job is a new run.

    A launcher's id that is no valid run id is mapped by ``launcher_run_id``.

    Returns:
        ``(run_id, source)``: ``(None, "STEPBARRIER_RUN_ID")`` when that is set
        empty, ``(None, None)`` when none of them is set.

    Raises:
        ConfigurationError: ``STEPBARRIER_RUN_ID`` is no valid run id (a
            launcher's id never raises: it is mapped).
    """
    env = os.environ if environ is None else environ
    explicit = env.get("STEPBARRIER_RUN_ID")
    if explicit is not None:
        # set, even empty, it is the user's word: an empty one switches the
        # launchers' ids off (e.g. a Slurm chief and workers in separate jobs)
        text = explicit.strip()
        return (validate_run_id(text) if text else None), "STEPBARRIER_RUN_ID"
    torch_id = _get(env, "TORCHELASTIC_RUN_ID")
    if torch_id is not None and torch_id.lower() != "none":
        return launcher_run_id(torch_id), "TORCHELASTIC_RUN_ID"
    slurm_id = _get(env, "SLURM_JOB_ID")
    if slurm_id is not None:
        # a requeued job keeps its id but starts again: its own run, so that a
        # worker of the requeue never trusts a final step the earlier try left
        restarts = _get(env, "SLURM_RESTART_COUNT")
        suffix = ""
        if restarts is not None and _COUNT.fullmatch(restarts) is not None:
            suffix = f"-r{int(restarts)}" if int(restarts) > 0 else ""
        elif restarts is not None:
            suffix = f"-r{restarts}"  # not Slurm's form: kept, and mapped with the rest
        return launcher_run_id(f"slurm-{slurm_id}{suffix}"), "SLURM_JOB_ID"
    return None, None


def launcher_run_id(text: str) -> str:
    """A launcher's id (non-empty) as a run id: itself when it is a valid one.

    Otherwise (over 64 characters, or characters a run id refuses, e.g. a
    torchrun id ``job/7:a``) it is mapped, deterministically, so that every
    process of the run maps it alike, and two different ids stay different: its
    first ``LAUNCHER_ID_KEPT`` characters with each run of refused characters
    replaced by ``_``, then ``-`` and the first 16 hex digits of the SHA-256 of
    the whole id (UTF-8). A launcher's id is never refused: the user did not
    choose its form.

    Examples:
        >>> launcher_run_id("7f3c-run.1")
        '7f3c-run.1'
        >>> launcher_run_id("job/7:a")
        'job_7_a-3585317eb9ed3b7b'
    """
    if RUN_ID.fullmatch(text) is not None:
        return text
    # surrogatepass: an undecodable byte of the environment maps too, never raises
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{_NOT_IN_RUN_ID.sub('_', text[:LAUNCHER_ID_KEPT])}-{digest}"


def _env_int(
    env: Mapping[str, str], name: str, *, low: int, high: int, what: str = ""
) -> int | None:
    text = _get(env, name)
    if text is None:
        return None
    try:
        value = int(text, 10)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        shown = f"{name} ({what})" if what else name
        raise ConfigurationError(
            f"{shown} must be an integer from {low} to {high}, got {text[:80]!r}",
            variable=name,
        )
    return value


def _env_flag(env: Mapping[str, str], name: str) -> bool:
    text = _get(env, name)
    if text is None or text.lower() in ("0", "false", "no", "off"):
        return False
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    raise ConfigurationError(f"{name} must be 1 or 0, got {text[:80]!r}", variable=name)


def _env_seconds(env: Mapping[str, str], name: str, *, high: float = 1e9) -> float | None:
    text = _get(env, name)
    if text is None:
        return None
    # what the command's options take: 600, 0.5, 90s, 10m, 1h, 250ms
    parsed = parse_duration(text)
    value = math.nan if parsed is None else parsed
    if not (math.isfinite(value) and 0 < value <= high):
        raise ConfigurationError(
            f"{name} must be a duration above 0 and at most {high:g} s ({DURATION_EXAMPLES}), "
            f"got {text[:80]!r}",
            variable=name,
        )
    return value


def _env_file(env: Mapping[str, str], name: str) -> str | None:
    path = _get(env, name)
    if path is None:
        return None
    if not os.path.isfile(path):
        raise ConfigurationError(
            f"{name} must name a readable file, but {path[:200]!r} is not a file",
            variable=name,
        )
    return path


MAX_PASSWORD_FILE = 4096
"""The most bytes a password file may hold, its trailing newline included."""


def read_password_file(path: str, *, name: str, variable: str) -> str:
    """The text of the password file at ``path``, without its trailing newlines.

    Only a regular file (or a link to one) of at most ``MAX_PASSWORD_FILE``
    bytes is read: a device such as ``/dev/zero`` or ``/dev/stdin``, a pipe or
    a directory is refused before anything is read (it might never end, or
    block), and so is a larger file, after reading one byte more than the
    limit. The file may be empty (the caller decides what that means).

    Args:
        path: The file to read.
        name: What the message names the file by, e.g. ``--password-file``.
        variable: The ``ConfigurationError``'s ``variable``.

    Raises:
        ConfigurationError: The file is missing, unreadable, not a regular file,
            too large or not UTF-8; the message names it, never its content.
    """
    shown = repr(path[:200])
    try:
        # O_NONBLOCK: opening a FIFO without a writer must not block
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ConfigurationError(
            f"{name}: cannot read {shown} ({type(exc).__name__})", variable=variable
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigurationError(
                f"{name}: {shown} is not a regular file (a device, a pipe or a directory "
                "could be read for ever, or block); name a file that holds the password",
                variable=variable,
            )
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_PASSWORD_FILE + 1)
    except OSError as exc:
        raise ConfigurationError(
            f"{name}: cannot read {shown} ({type(exc).__name__})", variable=variable
        ) from None
    finally:
        os.close(fd)
    if len(data) > MAX_PASSWORD_FILE:
        raise ConfigurationError(
            f"{name}: {shown} holds more than {MAX_PASSWORD_FILE} bytes; a password file "
            "holds only the password (and a newline)",
            variable=variable,
        )
    try:
        return data.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise ConfigurationError(
            f"{name}: cannot read {shown} (it is not UTF-8 text)", variable=variable
        ) from None


def _password(env: Mapping[str, str]) -> str | None:
    direct = env.get("STEPBARRIER_REDIS_PASSWORD") or None
    path = _get(env, "STEPBARRIER_REDIS_PASSWORD_FILE")
    if direct is not None and path is not None:
        raise ConfigurationError(
            "set STEPBARRIER_REDIS_PASSWORD or STEPBARRIER_REDIS_PASSWORD_FILE, not both",
            variable="STEPBARRIER_REDIS_PASSWORD_FILE",
        )
    if path is None:
        return direct
    variable = "STEPBARRIER_REDIS_PASSWORD_FILE"
    secret = read_password_file(path, name=variable, variable=variable)
    if not secret:
        raise ConfigurationError(f"{variable}: {path[:200]!r} is empty", variable=variable)
    return secret


def _sentinels(env: Mapping[str, str]) -> tuple[tuple[str, int], ...]:
    text = _get(env, "STEPBARRIER_SENTINELS")
    if text is None:
        return ()
    result: list[tuple[str, int]] = []
    for item in text.split(","):
        host, sep, port_text = item.strip().rpartition(":")
        host = host.strip("[]")
        valid_host = bool(host) and re.match(r"^[A-Za-z0-9.:_-]+$", host) is not None
        if not sep or not valid_host or not port_text.isdigit():
            raise ConfigurationError(
                "STEPBARRIER_SENTINELS must be host:port pairs separated by commas, "
                f"e.g. 10.0.0.5:26379,10.0.0.6:26379; got {item.strip()[:80]!r}",
                variable="STEPBARRIER_SENTINELS",
            )
        port = int(port_text)
        if not 0 < port < 65536:
            raise ConfigurationError(
                f"STEPBARRIER_SENTINELS: port must be 1-65535, got {item.strip()!r}",
                variable="STEPBARRIER_SENTINELS",
            )
        result.append((host, port))
    return tuple(result)
