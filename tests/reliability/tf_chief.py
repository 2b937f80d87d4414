"""A TensorFlow chief whose training ends early: reaching ``last_step`` ends the job.

    python -m tests.reliability.tf_chief RECORDS LAST_STEP

A local ``MonitoredTrainingSession`` (graph mode, no cluster) with the
``GlobalStepPublisherHook`` (configured from ``STEPBARRIER_*``, told
``last_step=LAST_STEP``) trains until ``StopAtStepHook`` stops it at LAST_STEP;
closing the session runs the hook's ``end()``, which finishes the job.
Records, one JSON object a line: ``trained`` (the final global step) and
``ended`` (after the session closed).
"""

from __future__ import annotations

import sys
import time

import tensorflow as tf

from stepbarrier.tf_hooks import GlobalStepPublisherHook
from tests.reliability.roles import Records


def main(records_path: str, last_step: int) -> int:
    records = Records(records_path)
    tf.compat.v1.disable_eager_execution()
    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.assign_add(global_step, 1)
        with tf.compat.v1.train.MonitoredTrainingSession(
            is_chief=True,
            chief_only_hooks=[GlobalStepPublisherHook(last_step=last_step)],
            hooks=[tf.compat.v1.train.StopAtStepHook(last_step=last_step)],
            checkpoint_dir=None,
            save_checkpoint_secs=None,
            save_summaries_steps=None,
            save_summaries_secs=None,
            log_step_count_steps=None,
        ) as session:
            step = 0
            while not session.should_stop():
                step = int(session.run(train_op))
                time.sleep(0.01)
            records.write("trained", step=step)
    records.write("ended")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
