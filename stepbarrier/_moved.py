"""The operator modules' old names, still importable after their move into ``stepbarrier.cli``.

``import stepbarrier.exporter`` (or ``stepbarrier.cli_reporting``, ...) gives
the very module ``stepbarrier.cli.exporter``, not a copy: one set of globals,
so a ``monkeypatch`` or a ``mock.patch`` through either name patches both,
``isinstance`` holds across them, and pickles made under the old names load.

Why a finder on ``sys.meta_path`` rather than a shim file per old name: the
top level keeps only the core, not fifteen more files whose whole content is an
import, and one table says what moved where. The finder answers only the names
in ``MOVED`` and only once the normal finders found nothing, so it cannot hide
a real module; it imports nothing until an old name is imported. Type checkers
do not see the old names: code checked with mypy should use the new ones.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

MOVED = {
    "stepbarrier.cli_reporting": "stepbarrier.cli.reporting",
    "stepbarrier.cli_functions": "stepbarrier.cli.functions",
    "stepbarrier.cli_acl": "stepbarrier.cli.acl",
    "stepbarrier.cli_barrier": "stepbarrier.cli.barrier",
    "stepbarrier.cli_ops": "stepbarrier.cli.ops",
    "stepbarrier.status_view": "stepbarrier.cli.status_view",
    "stepbarrier.jobs_view": "stepbarrier.cli.jobs_view",
    "stepbarrier.waiter_summary_view": "stepbarrier.cli.waiter_summary_view",
    "stepbarrier.barrier_view": "stepbarrier.cli.barrier_view",
    "stepbarrier.demo": "stepbarrier.cli.demo",
    "stepbarrier.local_cluster": "stepbarrier.cli.local_cluster",
    "stepbarrier.exporter": "stepbarrier.cli.exporter",
    "stepbarrier.live_chief": "stepbarrier.cli.live_chief",
    "stepbarrier.job_listing": "stepbarrier.cli.job_listing",
    "stepbarrier.acl_rules": "stepbarrier.cli.acl_rules",
}
"""Each old module name and the module it names now."""


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports each old name in ``MOVED`` as the module it names now."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module(MOVED[spec.name])
        # The import system is about to set module.__spec__ to the old name's
        # spec; keep the module's own, to put back in exec_module.
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        alias_spec = module.__spec__
        assert alias_spec is not None
        module.__spec__ = alias_spec.loader_state  # the module ran already, under its new name


def alias_moved_modules() -> None:
    """Let the old names in ``MOVED`` import; idempotent."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
