"""The operator surface: the ``stepbarrier`` command and what only it uses.

``cli`` is the click group (built in ``commands``) and ``main`` the console
script (``stepbarrier.cli:main``); beside them are the commands, the terminal
views, the demo and its local cluster, the job listing, the Prometheus exporter
and the ACL rules. The core (the package's top level) never imports from here.
These modules used to sit at the top level as ``stepbarrier.cli_reporting``,
``stepbarrier.exporter`` and so on: those names still import the very same
modules (``stepbarrier._moved``).

Only ``cli`` and ``main`` are bound here, so that ``stepbarrier.cli.exporter``
is always the module: several commands share a name with a module beside them
(``acl``, ``exporter``, ``demo``), and binding one here would hide its module.
"""

from stepbarrier.cli.commands import cli, main

__all__ = ["cli", "main"]
