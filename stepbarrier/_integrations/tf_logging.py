"""Where the TensorFlow hooks' lines go when the application configured no logging.

``stepbarrier.tf_hooks`` imports this module after checking that TensorFlow
can be imported.
"""

from __future__ import annotations

import logging

import tensorflow as tf


class _ToTensorFlow(logging.Handler):
    """Hands stepbarrier's records to TensorFlow's logger, at its verbosity."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return  # the application configured logging since: the record goes there
        tf_logger = tf.get_logger()
        if record.levelno >= tf_logger.getEffectiveLevel():
            tf_logger.handle(record)


_to_tensorflow = _ToTensorFlow()
_level_set: int | None = None  # the level follow_tensorflow_logging gave the logger


def follow_tensorflow_logging() -> None:
    """Let stepbarrier's lines follow TensorFlow's logger and verbosity, unless the
    application configured logging for them.

    A TensorFlow user sets ``tf.compat.v1.logging.set_verbosity(INFO)`` and sees
    TensorFlow's lines on stderr, with no ``logging.basicConfig``: without this,
    stepbarrier's lines (the same "Waiting for global step N before starting
    training." as TensorFlow's hook, progress, the release) would not be
    shown. When no handler is configured for the ``stepbarrier`` logger or
    above it, one is added that hands records to ``tf.get_logger()``, and the
    ``stepbarrier`` logger's level follows TensorFlow's verbosity. The hooks
    call it in ``begin()`` and when a wait starts; nothing changes once the
    application configures logging itself.
    """
    global _level_set
    sb_logger = logging.getLogger("stepbarrier")
    ours = _to_tensorflow in sb_logger.handlers
    # the logger's level is ours to follow TensorFlow's only if the application
    # left it unset (or we set it): an application's own level stands
    level_ours = sb_logger.level == logging.NOTSET or sb_logger.level == _level_set
    if ours and logging.getLogger().handlers:
        # the application configured logging since: its settings decide
        sb_logger.removeHandler(_to_tensorflow)
        if level_ours and _level_set is not None:
            sb_logger.setLevel(logging.NOTSET)
        _level_set = None
        return
    if not ours and sb_logger.hasHandlers():
        return  # the application's own logging decides
    if not ours:
        sb_logger.addHandler(_to_tensorflow)
    if level_ours:
        _level_set = tf.get_logger().getEffectiveLevel()
        sb_logger.setLevel(_level_set)
