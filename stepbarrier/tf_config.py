"""TensorFlow's ``TF_CONFIG``: which role and task id it gives this host.

A task of type ``chief`` or ``master`` is the chief (task id 0). A ``worker``
with index *i* has task id *i* + 1 when the cluster has a chief, and *i*
otherwise, in which case worker 0 is the chief, as in TensorFlow. ``ps`` and
``evaluator`` tasks have no barrier role. The text comes from the caller: this
module reads no environment.
"""

from __future__ import annotations

import json
from typing import Literal

from stepbarrier.errors import ConfigurationError

Role = Literal["chief", "worker"]


def role_from_tf_config(text: str | None) -> tuple[Role | None, int | None]:
    """Role and global task id (chief = 0) from TensorFlow's ``TF_CONFIG``."""
    if text is None or not text.strip():
        return None, None
    try:
        spec = json.loads(text)
    except (ValueError, RecursionError):
        raise ConfigurationError(
            "TF_CONFIG must be JSON like "
            '{"cluster": {...}, "task": {"type": "worker", "index": 0}}',
            variable="TF_CONFIG",
        ) from None
    task = spec.get("task") if isinstance(spec, dict) else None
    cluster = spec.get("cluster", {}) if isinstance(spec, dict) else None
    if not isinstance(task, dict) or not isinstance(cluster, dict):
        raise ConfigurationError(
            'TF_CONFIG needs a "task" object and a "cluster" object',
            variable="TF_CONFIG",
        )
    kind, index = task.get("type"), task.get("index", 0)
    if not isinstance(kind, str) or isinstance(index, bool) or not isinstance(index, int):
        raise ConfigurationError(
            'TF_CONFIG "task" needs a string "type" and an integer "index"',
            variable="TF_CONFIG",
        )
    if not 0 <= index <= 1_000_000:
        raise ConfigurationError(
            f'TF_CONFIG "task" index must be from 0 to 1000000, got {index}',
            variable="TF_CONFIG",
        )
    has_chief = bool(cluster.get("chief")) or bool(cluster.get("master"))
    if kind in ("chief", "master"):
        return "chief", 0
    if kind == "worker":
        if has_chief:
            return "worker", index + 1
        return ("chief" if index == 0 else "worker"), index
    if kind in ("ps", "evaluator"):
        return None, None
    raise ConfigurationError(
        f'TF_CONFIG "task" type must be chief, master, worker, ps or evaluator, got {kind[:40]!r}',
        variable="TF_CONFIG",
    )
