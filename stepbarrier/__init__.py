"""stepbarrier: hold distributed-training workers until the chief reaches a step.

A Redis-backed replacement for TensorFlow's ``GlobalStepWaiterHook``: the chief
publishes its global step, each worker waits for its ``wait_until_step`` and
starts within milliseconds of it, with timeouts, a heartbeat that tells a slow
chief from a dead one, and a registry that shows who waits for what.

The core (this package's top level) needs only the standard library, ``redis``
and ``tenacity``; TensorFlow and Keras live in ``stepbarrier.tf_hooks`` and
``stepbarrier.keras_callbacks``. Importing stepbarrier contacts no server.
"""

from stepbarrier._barriers.barrier import Barrier, BarrierInfo
from stepbarrier._chief.publisher import StepPublisher
from stepbarrier._config.schedule import schedule_wait_until_step
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.registry import WaiterInfo
from stepbarrier._inspect.status import JobStatus, read_status
from stepbarrier._progress.reporter import ProgressReporter
from stepbarrier._protocol.barrier_record import BarrierState
from stepbarrier._worker.follow import Crossed
from stepbarrier._worker.waiter import StepSource, StepWaiter
from stepbarrier.errors import (
    BarrierAborted,
    BarrierTimeout,
    ConfigurationError,
    RedisRefused,
    RedisUnavailable,
    StepBarrierError,
)

__version__ = "0.1.0"


__all__ = [
    "Barrier",
    "BarrierAborted",
    "BarrierConfig",
    "BarrierInfo",
    "BarrierState",
    "BarrierTimeout",
    "ConfigurationError",
    "Crossed",
    "JobStatus",
    "ProgressReporter",
    "RedisRefused",
    "RedisUnavailable",
    "StepBarrierError",
    "StepPublisher",
    "StepSource",
    "StepWaiter",
    "WaiterInfo",
    "__version__",
    "read_status",
    "schedule_wait_until_step",
]
