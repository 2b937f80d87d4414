"""The ``stepbarrier`` command: ``main`` (the console script) and ``cli`` (its click
group, for ``mkdocs-click`` and ``click.testing``); everything beside them is private."""

from stepbarrier.cli._group import cli, main

__all__ = ["cli", "main"]
