"""Our reading of ``TF_CONFIG`` against TensorFlow's own functions, case by case.

TensorFlow reads the task with ``TFConfigClusterResolver`` and decides the
chief and the global task id with ``multi_worker_util.is_chief`` and
``id_in_cluster``; for every chief and worker task of every cluster below,
``task_from_tf_config`` must say the same.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import tensorflow as tf
from tensorflow.python.distribute import multi_worker_util

from stepbarrier._config.tf_config import load_tf_config, task_from_tf_config

pytestmark = pytest.mark.tensorflow

CLUSTERS: list[dict[str, Any]] = [
    {"chief": ["c:0"], "worker": ["w:0", "w:1", "w:2"], "ps": ["p:0"]},
    {"worker": ["w:0", "w:1"], "ps": ["p:0", "p:1"]},
    {"worker": ["w:0"]},
    {"chief": [], "worker": ["w:0", "w:1"], "ps": ["p:0"]},  # an empty chief job still counts
    {"chief": {}, "worker": ["w:0", "w:1"]},
    {"chief": ["c:0"], "worker": ["w:0"], "evaluator": ["e:0"]},
]


def tasks(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    """Each chief and worker task, its index both as a number and as a string."""
    found = []
    for kind in ("chief", "worker"):
        for index in range(len(cluster.get(kind, []))):
            found += [{"type": kind, "index": index}, {"type": kind, "index": str(index)}]
    return found


CASES = [
    pytest.param(cluster, task, id=f"{json.dumps(cluster)}-{json.dumps(task)}")
    for cluster in CLUSTERS
    for task in tasks(cluster)
]


def tensorflows_view(text: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, bool, int]:
    monkeypatch.setenv("TF_CONFIG", text)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    cluster, kind, index = resolver.cluster_spec(), resolver.task_type, resolver.task_id
    return (
        kind,
        multi_worker_util.is_chief(cluster, kind, index),
        multi_worker_util.id_in_cluster(cluster, kind, index),
    )


@pytest.mark.parametrize(("cluster", "task"), CASES)
def test_the_chief_and_the_task_id_are_tensorflows(
    cluster: dict[str, Any], task: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = json.dumps({"cluster": cluster, "task": task})
    ours = task_from_tf_config(load_tf_config(text))
    assert ours.role is not None and ours.task_id is not None
    assert (ours.type, ours.role == "chief", ours.task_id) == tensorflows_view(text, monkeypatch)


@pytest.mark.parametrize(
    "spec",
    [
        {"cluster": {"worker": ["w:0"]}},  # no task
        {"cluster": {"worker": ["w:0"]}, "task": {"index": 0}},  # no type
        {"cluster": {"worker": ["w:0"]}, "task": "worker"},
        {"cluster": {"worker": ["w:0"]}, "task": {"type": "client", "index": "1"}},
    ],
)
def test_a_task_tensorflows_resolver_accepts_is_accepted(
    spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = json.dumps(spec)
    monkeypatch.setenv("TF_CONFIG", text)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    ours = task_from_tf_config(load_tf_config(text))
    assert ours.type == resolver.task_type
    assert (ours.role, ours.task_id) == (None, None)
