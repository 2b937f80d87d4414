"""Each training task's own progress, reported into the job's progress hash for
``status``, ``watch`` and the exporter (docs/who-is-slow.md).
"""
