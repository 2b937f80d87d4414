"""The TensorFlow hooks and the Keras callbacks on a real local Redis Cluster."""

from __future__ import annotations

import dataclasses
import uuid

import keras
import numpy as np
import pytest
import tensorflow as tf

from stepbarrier import BarrierConfig, StepWaiter
from stepbarrier._redis.functions import install_functions
from stepbarrier.keras_callbacks import StepPublisherCallback, StepWaiterCallback
from stepbarrier.tf_hooks import GlobalStepPublisherHook, GlobalStepWaiterHook
from tests.cluster_harness import LocalCluster
from tests.tf.tf_graphs import NO_EXTRAS, Waiting, wait_registered

pytestmark = [pytest.mark.cluster, pytest.mark.tensorflow]


@pytest.fixture(scope="module", autouse=True)
def library(cluster: LocalCluster) -> None:
    with cluster.client() as client:
        install_functions(client)


def cluster_config(cluster: LocalCluster) -> BarrierConfig:
    return BarrierConfig(
        job=f"tf-{uuid.uuid4().hex[:8]}",
        redis_url=cluster.seed_url,
        redis_cluster=True,
        heartbeat=0.2,
        stall_timeout=60.0,
        run_id="run-1",  # a worker that starts after the end trusts its own run's end
    )


def test_the_session_hooks_on_a_cluster(cluster: LocalCluster) -> None:
    config = cluster_config(cluster)
    waiting = Waiting(lambda: StepWaiter(config).wait(12, timeout=60))
    wait_registered(config)
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.assign_add(step, 1)
        chief = GlobalStepPublisherHook(config, last_step=20)
        with tf.compat.v1.train.MonitoredTrainingSession(
            chief_only_hooks=[chief], **NO_EXTRAS
        ) as session:
            for _ in range(20):
                session.run(train)
    released = waiting.join()
    assert released is not None and 12 <= released <= 20  # the chief runs on meanwhile
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        worker = GlobalStepWaiterHook(5, config)
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=[worker], **NO_EXTRAS) as session:
            session.run(tf.compat.v1.train.get_global_step())
    assert worker.released_at_step == 20  # the finished job's final step


def test_the_keras_callbacks_on_a_cluster(cluster: LocalCluster) -> None:
    # a run id and a finish at the last step: the second worker starts after the
    # chief's fit ended, and only its own run's finished state may release it
    config = dataclasses.replace(cluster_config(cluster), run_id="keras-run")
    model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    x = np.zeros((40, 2), dtype="float32")
    worker = StepWaiterCallback(6, config)
    waiting = Waiting(lambda: StepWaiter(config).wait(8, timeout=60))
    wait_registered(config)
    chief = StepPublisherCallback(config, last_step=10)
    model.fit(x, x[:, :1], batch_size=4, verbose=0, callbacks=[chief])
    assert waiting.join() is not None
    other = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
    other.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    other.fit(x, x[:, :1], batch_size=4, verbose=0, callbacks=[worker])
    assert worker.released_at_step is not None and worker.released_at_step >= 6
