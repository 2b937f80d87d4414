"""The package's shape: a framework-free core at the top, the operator surface in ``cli``.

The operator modules moved into ``stepbarrier.cli``; their old names
(``stepbarrier.exporter``, ``stepbarrier.cli_reporting``, ...) still import,
as the very same modules.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import stepbarrier
from stepbarrier._moved import MOVED
from tests.conftest import ROOT, subprocess_env

PACKAGE = Path(ROOT, "stepbarrier")


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_module_name_imports_the_very_module_it_moved_to(old: str, new: str) -> None:
    module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert sys.modules[old] is sys.modules[new]
    assert module.__name__ == new
    assert module.__spec__ is not None and module.__spec__.name == new
    assert getattr(stepbarrier, old.rpartition(".")[2]) is module


def test_each_old_name_stands_for_a_module_that_exists_and_no_file_hides_it() -> None:
    for old, new in MOVED.items():
        assert Path(ROOT, *new.split(".")).with_suffix(".py").is_file(), new
        assert not Path(ROOT, *old.split(".")).with_suffix(".py").exists(), old


def test_the_old_names_import_in_a_fresh_interpreter_in_every_form() -> None:
    code = (
        "import stepbarrier.cli_reporting, stepbarrier.cli.reporting\n"
        "assert stepbarrier.cli_reporting is stepbarrier.cli.reporting\n"
        "from stepbarrier.local_cluster import EmbeddedRedis\n"
        "from stepbarrier.cli.local_cluster import EmbeddedRedis as moved\n"
        "assert EmbeddedRedis is moved\n"
        "from stepbarrier import exporter\n"
        "import stepbarrier.cli.exporter\n"
        "assert exporter is stepbarrier.cli.exporter\n"
    )
    subprocess.run([sys.executable, "-c", code], env=subprocess_env(), check=True, timeout=60)


def test_a_patch_through_an_old_name_reaches_the_moved_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("stepbarrier.job_listing.MAX_JOBS", 3)
    from stepbarrier.cli import job_listing

    assert job_listing.MAX_JOBS == 3


def test_the_cli_package_binds_the_group_and_main_only() -> None:
    """A command bound in the package would hide the module of the same name
    (``stepbarrier.cli.exporter`` is a module, ``exporter`` also a command)."""
    import stepbarrier.cli
    import stepbarrier.cli.exporter

    assert stepbarrier.cli.__all__ == ["cli", "main"]
    assert isinstance(stepbarrier.cli.exporter, type(stepbarrier))


def _imported_names(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_core_module_imports_the_operator_surface() -> None:
    """The top level is the floor a chief or a worker runs on: it never reaches
    into ``stepbarrier.cli`` (or an old name of a module there); only
    ``python -m stepbarrier`` does."""
    operator = {"stepbarrier.cli", *MOVED}
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name == "__main__.py":
            continue
        for name in _imported_names(path):
            top = ".".join(name.split(".")[:2])
            assert top not in operator, f"{path.name} imports {name}"


def test_import_stepbarrier_loads_neither_click_nor_rich_nor_the_cli() -> None:
    code = (
        "import sys, stepbarrier; "
        "loaded = [m for m in ('click', 'rich', 'stepbarrier.cli') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], env=subprocess_env(), check=True, timeout=60)
