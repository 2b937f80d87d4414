"""Each training task's own progress: hand its step over, and let a thread report it.

``reporter`` (``ProgressReporter``): the chief and every worker report their own
step, cheaply, into the job's progress hash (docs/who-is-slow.md), for
``status``, ``watch`` and the exporter to tell who is behind and who is stuck.
"""
