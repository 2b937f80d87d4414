"""stepbarrier: hold distributed-training workers until the chief reaches a step.

A Redis-backed replacement for TensorFlow's ``GlobalStepWaiterHook``: the chief
publishes its global step, each worker waits for its ``wait_until_step`` and
starts within milliseconds of it, with timeouts, a heartbeat that tells a slow
chief from a dead one, and a registry that shows who waits for what.

The core (this package's top level) needs only the standard library, ``redis``
and ``tenacity``; TensorFlow and Keras live in ``stepbarrier.tf_hooks`` and
``stepbarrier.keras_callbacks``. Importing stepbarrier contacts no server.
"""

from stepbarrier import _moved
from stepbarrier.barrier import Barrier
from stepbarrier.barrier_state import BarrierState
from stepbarrier.config import BarrierConfig
from stepbarrier.errors import (
    BarrierAborted,
    BarrierTimeout,
    ConfigurationError,
    RedisRefused,
    RedisUnavailable,
    StepBarrierError,
)
from stepbarrier.publisher import StepPublisher
from stepbarrier.schedule import schedule_wait_until_step
from stepbarrier.status import BarrierInfo, JobStatus, WaiterInfo, read_status
from stepbarrier.waiter import StepSource, StepWaiter

__version__ = "0.1.0"

_moved.alias_moved_modules()  # the operator modules' old names: stepbarrier.exporter, ...

__all__ = [
    "Barrier",
    "BarrierAborted",
    "BarrierConfig",
    "BarrierInfo",
    "BarrierState",
    "BarrierTimeout",
    "ConfigurationError",
    "JobStatus",
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
