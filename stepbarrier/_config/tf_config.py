"""TensorFlow's ``TF_CONFIG``: the task it gives this host, and that task's barrier role.

It is read as TensorFlow reads it (``TFConfigClusterResolver``): no ``"task"``
means no task, ``"index"`` goes through ``int()`` (``"1"`` is 1, a missing one
is 0) and any task type is accepted. The role follows
``multi_worker_util.is_chief`` and ``id_in_cluster``: a ``chief`` (or a TF1
``master``) task is the chief, task id 0; worker *i* is the chief only when the
cluster has no ``chief`` or ``master`` job at all (an empty one counts), and
otherwise has task id *i* plus the number of chief tasks. ``ps`` and
``evaluator`` tasks, and types TensorFlow does not train with, have no barrier
role. Only what the role needs is checked, so a ``TF_CONFIG`` that TensorFlow
accepts is refused only when it cannot give a role. The text comes from the
caller: this module reads no environment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from stepbarrier.errors import ConfigurationError

Role = Literal["chief", "worker"]

CHIEF_TASK_TYPES = ("chief", "master")
"""Task types that are the chief (``master`` is the TF1 name)."""
NO_ROLE_TASK_TYPES = ("ps", "evaluator")
"""Task types that take no part in the barrier: they get no hooks or callbacks."""
MAX_TASK_ID = 1_000_000


@dataclass(frozen=True)
class TfTask:
    """The task ``TF_CONFIG`` gives this host.

    Attributes:
        type: The task type as TensorFlow reads it (``str()`` of it), ``None``
            when ``TF_CONFIG`` is unset or names no task.
        role: The barrier role; ``None`` for ps, evaluator and unknown types.
        task_id: The global task id (the chief being 0); ``None`` without a role.
    """

    type: str | None = None
    role: Role | None = None
    task_id: int | None = None


def task_from_tf_config(text: str | None) -> TfTask:
    """The task, barrier role and global task id that ``TF_CONFIG`` gives.

    Args:
        text: The value of ``TF_CONFIG`` (``None`` or blank: no task).

    Raises:
        ConfigurationError: The text is not a JSON object, or it makes this host
            a worker but its index or the cluster's chief job is unusable.

    Example:
        >>> task_from_tf_config('{"cluster": {"chief": ["c:1"], "worker": ["w:1"]},'
        ...                     ' "task": {"type": "worker", "index": "0"}}')
        TfTask(type='worker', role='worker', task_id=1)
    """
    spec = _load(text)
    task = spec.get("task")
    if not isinstance(task, dict) or "type" not in task:
        return TfTask()
    kind = str(task["type"])
    if kind in CHIEF_TASK_TYPES:
        return TfTask(kind, "chief", 0)
    if kind != "worker":
        return TfTask(kind)
    index = _task_index(task)
    chiefs = _chief_tasks(spec.get("cluster", {}))
    if chiefs is None and index == 0:
        return TfTask(kind, "chief", 0)
    return TfTask(kind, "worker", index + (chiefs or 0))


def trainer_count(text: str | None) -> int | None:
    """How many tasks of ``TF_CONFIG``'s cluster train: its chief and worker tasks.

    They are the parties of the job's named barriers (task ids ``0..count-1``).

    Returns:
        The count; ``None`` when ``TF_CONFIG`` lists no chief and no worker task.

    Raises:
        ConfigurationError: The text is not a JSON object, or its cluster is malformed.

    Example:
        >>> trainer_count('{"cluster": {"ps": ["p:1"], "chief": ["c:1"],'
        ...               ' "worker": ["w:1", "w:2"]}}')
        3
    """
    cluster = _load(text).get("cluster", {})
    chiefs = _chief_tasks(cluster) or 0
    workers = cluster.get("worker", [])  # _chief_tasks checked that it is a dict
    if not isinstance(workers, (list, dict)):
        raise ConfigurationError(
            'TF_CONFIG "cluster": the worker job must be a list of addresses',
            variable="TF_CONFIG",
        )
    return (chiefs + len(workers)) or None


def _load(text: str | None) -> dict[str, Any]:
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


def _task_index(task: dict[str, Any]) -> int:
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
    return index


def _chief_tasks(cluster: object) -> int | None:
    """How many chief tasks the cluster has; ``None`` when it has no chief job."""
    if not isinstance(cluster, dict):
        raise ConfigurationError(
            'TF_CONFIG "cluster" must be an object of jobs, e.g. '
            '{"chief": ["host:2222"], "worker": ["host:2223"]}',
            variable="TF_CONFIG",
        )
    jobs = [cluster[kind] for kind in CHIEF_TASK_TYPES if kind in cluster]
    if not jobs:
        return None
    if not all(isinstance(tasks, (list, dict)) for tasks in jobs):
        raise ConfigurationError(
            'TF_CONFIG "cluster": a chief job must be a list of addresses, e.g. '
            '"chief": ["host:2222"]',
            variable="TF_CONFIG",
        )
    return sum(len(tasks) for tasks in jobs)
