"""A TF1 user's logging: ``tf.compat.v1.logging.set_verbosity(INFO)``, no ``basicConfig``.

Such a user sees TensorFlow's lines on stderr, and must see the hook's too:
the same "Waiting for global step N before starting training." line as
TensorFlow's hook, and the release. Each case runs in its own process: the
logging setup is process-wide. The tests that prove the row
"`tf.compat.v1.logging.set_verbosity(INFO)`, no `logging.basicConfig`" of the
comparison table in docs/tensorflow-keras.md ("Parity with TensorFlow's hook")
name it; the others are what the application's own logging decides.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import subprocess_env
from tests.redis_harness import free_port

pytestmark = pytest.mark.tensorflow

SCRIPT = """
import os, sys, threading, time
import tensorflow as tf
from stepbarrier.tf_hooks import GlobalStepWaiterHook

if sys.argv[1] in ("info", "quiet"):
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
if sys.argv[1] == "quiet":
    import logging
    logging.getLogger("stepbarrier").setLevel(logging.ERROR)  # the application's choice
with tf.Graph().as_default():
    gstep = tf.compat.v1.train.get_or_create_global_step()
    to_7 = tf.compat.v1.assign(gstep, 7)
    if sys.argv[2:] == ["tensorflow"]:
        hook = tf.compat.v1.train.GlobalStepWaiterHook(5)
    else:
        hook = GlobalStepWaiterHook(5)
    hook.begin()
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        # after the first Redis retries (1 s) have given up, when Redis is down
        mover = threading.Timer(2.5, lambda: sess.run(to_7))
        mover.start()
        hook.before_run(tf.compat.v1.train.SessionRunContext(None, sess))
        mover.join()
if sys.argv[2:] != ["tensorflow"]:  # TensorFlow's hook keeps no release
    print("released at", hook.released_at_step, "by", hook.released_by)
"""
WAITING = "Waiting for global step 5 before starting training."


def run_script(
    verbosity: str, hook: str = "stepbarrier", **env: str
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, verbosity, hook],
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    if hook == "stepbarrier":
        assert "released at 7 by the session's global step" in result.stdout
    return result


def test_at_info_verbosity_tensorflow_s_hook_and_ours_say_the_same_waiting_line() -> None:
    """Row "`tf.compat.v1.logging.set_verbosity(INFO)`, no `logging.basicConfig`" of the
    comparison table in docs/tensorflow-keras.md, side by side: TensorFlow's hook
    says its line on stderr at INFO, and ours says the same line there, at INFO, in
    TensorFlow's format (``LEVEL:logger:message``)."""
    theirs = run_script("info", "tensorflow").stderr
    ours = run_script("info").stderr
    [their_line] = [line for line in theirs.splitlines() if line.endswith(WAITING)]
    [our_line] = [line for line in ours.splitlines() if line.endswith(WAITING)]
    assert their_line == f"INFO:tensorflow:{WAITING}", their_line
    assert our_line == f"INFO:stepbarrier.tf_hooks:{WAITING}", our_line


def test_at_info_verbosity_the_hook_s_lines_are_on_stderr_unconfigured() -> None:
    """Row "`tf.compat.v1.logging.set_verbosity(INFO)`, no `logging.basicConfig`" of the
    comparison table in docs/tensorflow-keras.md, unconfigured: the waiting line, the
    WARNING and the release on stderr."""
    err = run_script("info").stderr
    assert WAITING in err
    assert "STEPBARRIER_JOB is not set" in err
    assert "released at step 7 (target 5)" in err


def test_at_info_verbosity_the_hook_s_lines_are_on_stderr_configured() -> None:
    """Row "`tf.compat.v1.logging.set_verbosity(INFO)`, no `logging.basicConfig`" of the
    comparison table in docs/tensorflow-keras.md, configured (Redis down): the
    waiting line, the wait's own lines and the release on stderr."""
    err = run_script(
        "info",
        STEPBARRIER_JOB="tf1-logging",
        STEPBARRIER_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
    ).stderr
    assert WAITING in err
    assert "waiting for step 5" in err
    assert "waiting on the session's global step alone" in err  # Redis is down
    assert "released at step 7 (target 5)" in err and "by the session's global step" in err


def test_at_tensorflow_s_default_verbosity_only_the_warnings_show() -> None:
    err = run_script("default").stderr
    assert "STEPBARRIER_JOB is not set" in err  # a WARNING
    assert "Waiting for global step 5" not in err  # INFO, as TensorFlow's own line


def test_an_application_s_own_level_for_stepbarrier_stands() -> None:
    err = run_script("quiet").stderr
    assert "Waiting for global step 5" not in err and "STEPBARRIER_JOB is not set" not in err
