"""The one place that reads ``STEPBARRIER_*`` variables, ``TF_CONFIG`` and the launchers'.

Each variable is read as its setting's kind says (``settings.SETTINGS``); an error
names the variable, never a secret. ``settings`` builds the ``BarrierConfig`` from
what this module reads, so this module does not import it.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Mapping
from typing import Any, get_args

from stepbarrier._config.checks import TASK_ID, Kind, choice, refused
from stepbarrier._config.defaults import LAUNCHER_RANKS, Role, RunIdSource, TaskIdSource
from stepbarrier._config.tf_config import (
    NO_ROLE_TASK_TYPES,
    HostTask,
    load_tf_config,
    task_from_tf_config,
    trainer_count,
)
from stepbarrier._protocol.barrier_record import validate_parties
from stepbarrier._protocol.wire import RUN_ID
from stepbarrier.errors import ConfigurationError

ROLE = choice(*get_args(Role))


def _get(env: Mapping[str, str], name: str) -> str | None:
    return (env.get(name) or "").strip() or None


def job_in_env(environ: Mapping[str, str] | None = None) -> bool:
    """True if ``STEPBARRIER_JOB`` is set (not blank): stepbarrier is configured here."""
    return _get(os.environ if environ is None else environ, "STEPBARRIER_JOB") is not None


def barrier_role_from_env(environ: Mapping[str, str] | None = None) -> Role | None:
    """This host's barrier role (``barrier_role``), before anything else is read."""
    return barrier_role(task_from_env(environ))


def barrier_role(task: HostTask) -> Role | None:
    """The barrier role of ``task`` (``None``: a ps or evaluator task, which needs no
    ``STEPBARRIER_*`` variable); ``ConfigurationError`` if no variable gives one."""
    role, tf_type = task.role, task.type
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
    environ: Mapping[str, str] | None = None,
    parties: int | None = None,
    *,
    tf_config: dict[str, Any] | None = None,
) -> int:
    """The parties of the job's start and end barriers: ``parties`` if given, else
    the chief and worker tasks of ``TF_CONFIG`` (``tf_config`` if it was loaded);
    ``ConfigurationError`` if neither says, or ``parties`` is invalid."""
    if parties is not None:
        return validate_parties(parties)
    if tf_config is None:
        tf_config = load_tf_config((os.environ if environ is None else environ).get("TF_CONFIG"))
    found = trainer_count(tf_config)
    if found is None:
        raise ConfigurationError(
            "the start and end barriers need the number of parties (the chief and the "
            "workers): pass parties=N, or set TF_CONFIG to the cluster",
            variable="parties",
        )
    return found


def task_from_env(environ: Mapping[str, str] | None = None) -> HostTask:
    """This host's barrier role and task id, from the first variable that gives one,
    by the rules of docs/configuration.md#task-id-and-role. A variable is read (and
    checked: ``ConfigurationError``) only when those before it leave the task id
    open; a conflict is no error, the earlier one wins."""
    env = os.environ if environ is None else environ
    role = _read(env, "STEPBARRIER_ROLE", ROLE)
    task_id = _read(env, "STEPBARRIER_TASK_ID", TASK_ID)
    source: TaskIdSource | None = "STEPBARRIER_TASK_ID" if task_id is not None else None
    if role == "chief" and task_id is None:
        task_id, source = 0, "STEPBARRIER_ROLE"
    if role is not None and task_id is not None:
        return HostTask(role, task_id, source)
    # STEPBARRIER_ROLE and STEPBARRIER_TASK_ID win; TF_CONFIG is read only for
    # what they leave open, so that a TF_CONFIG this library cannot use never
    # blocks them
    tf_config = load_tf_config(env.get("TF_CONFIG"))
    tf_task = task_from_tf_config(tf_config)
    if task_id is None and tf_task.task_id is not None:
        task_id, source = tf_task.task_id, tf_task.task_id_source
    role = role or tf_task.role
    if (role is not None and task_id is not None) or tf_task.type is not None:
        return HostTask(role, task_id, source, tf_task.type, tf_config)
    torchrun = env.get("TORCHELASTIC_RUN_ID") is not None
    # torchrun sets both: a RANK without its id may be anyone's
    ranks = [name for name in LAUNCHER_RANKS if name != "RANK" or torchrun]
    launcher = next((name for name in ranks if _get(env, name) is not None), None)
    if launcher is None:
        return HostTask(role, task_id, source, None, tf_config)
    if task_id is None:
        # only now is its value needed: an explicit task id leaves it unread
        task_id = _read(env, launcher, TASK_ID, f"{launcher} ({LAUNCHER_RANKS[launcher]})")
        source = launcher
    if role is None:
        role = "chief" if task_id == 0 else "worker"
    return HostTask(role, task_id, source, None, tf_config)


_READ_APART = frozenset(
    ("STEPBARRIER_ROLE", "STEPBARRIER_TASK_ID", "STEPBARRIER_RUN_ID", "STEPBARRIER_REDIS_PASSWORD")
)
"""Read by ``task_from_env``, ``run_id_from_env`` and ``_password``."""


def settings_from_env(
    env: Mapping[str, str], settings: Mapping[str, Mapping[str, Any]], task: HostTask | None = None
) -> dict[str, Any]:
    """The ``BarrierConfig`` arguments that ``env`` gives (an unset or blank variable
    gives none); the role and task id are ``task``'s, if it was read already."""
    if _get(env, "STEPBARRIER_JOB") is None:
        raise ConfigurationError(
            "STEPBARRIER_JOB is required: name the job, e.g. STEPBARRIER_JOB=mnist-42",
            variable="STEPBARRIER_JOB",
        )
    values = {
        name: _read(env, setting["variable"], setting["kind"])
        for name, setting in settings.items()
        if setting["variable"] not in _READ_APART and _get(env, setting["variable"]) is not None
    }
    task = task or task_from_env(env)
    values["role"], values["task_id"], values["task_id_source"] = task[:3]
    values["run_id"], values["run_id_source"] = run_id_from_env(env)
    values["redis_password"] = _password(env)
    return values


def _read(env: Mapping[str, str], name: str, kind: Kind, shown: str = "") -> Any:
    """Variable ``name`` as ``kind`` reads it (``None``: unset or blank); an error
    names it as ``shown`` (default: ``name``)."""
    text = _get(env, name)
    return None if text is None else kind.parse(text, shown or name)


LAUNCHER_ID_KEPT = 40
"""How many characters of a launcher's id a mapped run id keeps."""
_NOT_IN_RUN_ID = re.compile(r"[^A-Za-z0-9._-]+")
_COUNT = re.compile(r"[0-9]{1,18}")


def run_id_from_env(
    environ: Mapping[str, str] | None = None,
) -> tuple[str | None, RunIdSource | None]:
    """The run id in force and the variable it came from (docs/configuration.md#run-id);
    a launcher's id is mapped, ``STEPBARRIER_RUN_ID`` is ``BarrierConfig``'s to check."""
    env = os.environ if environ is None else environ
    explicit = env.get("STEPBARRIER_RUN_ID")
    if explicit is not None:
        # set, even empty, it is the user's word: an empty one switches the
        # launchers' ids off (e.g. a Slurm chief and workers in separate jobs)
        return explicit.strip() or None, "STEPBARRIER_RUN_ID"
    torch_id = _get(env, "TORCHELASTIC_RUN_ID")
    if torch_id is not None and torch_id.lower() != "none":
        return launcher_run_id(torch_id), "TORCHELASTIC_RUN_ID"
    slurm_id = _get(env, "SLURM_JOB_ID")
    if slurm_id is not None:
        # a requeued job keeps its id but starts again: its own run, so that a
        # worker of the requeue never trusts a final step the earlier try left
        restarts = _get(env, "SLURM_RESTART_COUNT") or "0"
        if _COUNT.fullmatch(restarts) is not None:
            restarts = str(int(restarts))  # else not Slurm's form: kept, and mapped with the rest
        suffix = "" if restarts == "0" else f"-r{restarts}"
        return launcher_run_id(f"slurm-{slurm_id}{suffix}"), "SLURM_JOB_ID"
    return None, None


def launcher_run_id(text: str) -> str:
    """A launcher's id (non-empty) as a run id: itself, or mapped alike in every process
    (docs/configuration.md#run-id); never refused, as the user did not choose its form."""
    if RUN_ID.fullmatch(text) is not None:
        return text
    # surrogatepass: an undecodable byte of the environment maps too, never raises
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{_NOT_IN_RUN_ID.sub('_', text[:LAUNCHER_ID_KEPT])}-{digest}"


MAX_PASSWORD_FILE = 4096
"""The most bytes a password file may hold, its trailing newline included."""


def read_password_file(path: str, *, name: str, variable: str) -> str:
    """The text of the password file at ``path``, without its trailing newlines (empty:
    the caller's to judge); only a regular file of at most ``MAX_PASSWORD_FILE`` bytes,
    as a device or a pipe might never end. An error names it as ``name``, never its content."""
    shown = repr(path[:200])

    def refuse(why: str) -> ConfigurationError:
        return ConfigurationError(f"{name}: {why}", variable=variable)

    try:
        # O_NONBLOCK: opening a FIFO without a writer must not block
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise refuse(f"cannot read {shown} ({type(exc).__name__})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise refuse(
                f"{shown} is not a regular file (a device, a pipe or a directory could be "
                "read for ever, or block); name a file that holds the password"
            )
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_PASSWORD_FILE + 1)
    except OSError as exc:
        raise refuse(f"cannot read {shown} ({type(exc).__name__})") from None
    finally:
        os.close(fd)
    if len(data) > MAX_PASSWORD_FILE:
        raise refuse(
            f"{shown} holds more than {MAX_PASSWORD_FILE} bytes; a password file holds only "
            "the password (and a newline)"
        )
    try:
        return data.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise refuse(f"cannot read {shown} (it is not UTF-8 text)") from None


def _password(env: Mapping[str, str]) -> str | None:
    variable = "STEPBARRIER_REDIS_PASSWORD_FILE"
    direct = env.get("STEPBARRIER_REDIS_PASSWORD") or None
    path = _get(env, variable)
    if direct is not None and path is not None:
        raise ConfigurationError(
            f"set STEPBARRIER_REDIS_PASSWORD or {variable}, not both", variable=variable
        )
    if path is None:
        return direct
    secret = read_password_file(path, name=variable, variable=variable)
    if not secret:
        raise refused(variable, f"{path[:200]!r} is empty")
    return secret
