"""The operator surface: the ``stepbarrier`` command.

Public: ``main`` (the console script, ``stepbarrier.cli:main``) and ``cli``
(its click group, for ``mkdocs-click`` and ``click.testing``). Everything
beside them is private: ``_group`` (the group and the options every command
shares), ``_context`` (how a command takes its settings and reports its
outcome), ``_wait_options``, ``_commands/`` (one module per command group),
``_views/`` (how results look in a terminal), ``_demo/`` (``stepbarrier
demo`` and its local processes) and ``_exporter`` (the Prometheus exporter).
The library never imports from here.
"""

from stepbarrier.cli._group import cli, main

__all__ = ["cli", "main"]
