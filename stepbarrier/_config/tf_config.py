"""TensorFlow's ``TF_CONFIG``: the task it gives this host, and that task's barrier role.

Read as TensorFlow reads it (``TFConfigClusterResolver``, ``multi_worker_util``), by
the rules of docs/configuration.md#tf_config-fallback, which
tests/tf/test_tf_config_parity.py holds to TensorFlow's. Only what the role needs is
checked: a ``TF_CONFIG`` that TensorFlow accepts is refused only when it gives no role.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from stepbarrier._config.defaults import Role, TaskIdSource
from stepbarrier._protocol.wire import MAX_TASK_ID
from stepbarrier.errors import ConfigurationError

CHIEF_TASK_TYPES = ("chief", "master")
"""Task types that are the chief (``master`` is the TF1 name)."""
NO_ROLE_TASK_TYPES = ("ps", "evaluator")
"""Task types that take no part in the barrier: they get no hooks or callbacks."""


class HostTask(NamedTuple):
    """This host's barrier role (``None`` for ps, evaluator and unknown types), task id
    and the variable it came from; its task type (``None``: no task) and the content
    of ``TF_CONFIG``, if that had to be read."""

    role: Role | None = None
    task_id: int | None = None
    task_id_source: TaskIdSource | None = None
    type: str | None = None
    tf_config: dict[str, Any] | None = None


def task_from_tf_config(spec: dict[str, Any]) -> HostTask:
    """The task, barrier role and global task id (the chief tasks first) that
    ``TF_CONFIG`` (loaded) gives; ``ConfigurationError`` if it makes this host a
    worker but its index or the cluster's chief job is unusable."""
    task = spec.get("task")
    if not isinstance(task, dict) or "type" not in task:
        return HostTask()
    kind = str(task["type"])
    if kind in CHIEF_TASK_TYPES:
        return HostTask("chief", 0, "TF_CONFIG", kind)
    if kind != "worker":
        return HostTask(type=kind)
    value = task.get("index", 0)
    try:
        index = int(value)  # what TensorFlow's resolver does
    except (TypeError, ValueError, OverflowError):
        index = -1
    if not 0 <= index <= MAX_TASK_ID:
        raise ConfigurationError(
            f'TF_CONFIG "task" "index" must be an integer from 0 to {MAX_TASK_ID} '
            f"(a number or a string of digits), got {repr(value)[:40]}",
            variable="TF_CONFIG",
        )
    chiefs = _tasks(spec, CHIEF_TASK_TYPES, "a chief job")
    if chiefs is None and index == 0:
        return HostTask("chief", 0, "TF_CONFIG", kind)
    return HostTask("worker", index + (chiefs or 0), "TF_CONFIG", kind)


def trainer_count(spec: dict[str, Any]) -> int | None:
    """How many tasks of ``TF_CONFIG``'s cluster train, its chief and worker tasks:
    the parties of the job's named barriers (``None``: it lists none);
    ``ConfigurationError`` if the cluster is malformed."""
    chiefs = _tasks(spec, CHIEF_TASK_TYPES, "a chief job") or 0
    workers = _tasks(spec, ("worker",), "the worker job") or 0
    return (chiefs + workers) or None


def load_tf_config(text: str | None) -> dict[str, Any]:
    """The JSON object ``TF_CONFIG``'s text holds (``None`` or blank: ``{}``), else
    ``ConfigurationError``."""
    if text is None or not text.strip():
        return {}
    try:
        spec = json.loads(text)
    except (ValueError, RecursionError):
        spec = None
    if not isinstance(spec, dict):
        raise ConfigurationError(
            "TF_CONFIG must be a JSON object like "
            '{"cluster": {...}, "task": {"type": "worker", "index": 0}}',
            variable="TF_CONFIG",
        )
    return spec


def _tasks(spec: dict[str, Any], jobs: tuple[str, ...], what: str) -> int | None:
    """How many tasks the ``jobs`` of ``TF_CONFIG``'s cluster have; ``None`` when it has
    none of them."""
    cluster = spec.get("cluster", {})
    if not isinstance(cluster, dict):
        raise ConfigurationError(
            'TF_CONFIG "cluster" must be an object of jobs, e.g. '
            '{"chief": ["host:2222"], "worker": ["host:2223"]}',
            variable="TF_CONFIG",
        )
    found = [cluster[job] for job in jobs if job in cluster]
    if not all(isinstance(tasks, (list, dict)) for tasks in found):
        raise ConfigurationError(
            f'TF_CONFIG "cluster": {what} must be a list of addresses, e.g. '
            f'"{jobs[0]}": ["host:2222"]',
            variable="TF_CONFIG",
        )
    return sum(map(len, found)) if found else None
