"""The package's shape: a public surface, private sub-packages by side of the protocol.

The public modules are ``stepbarrier``, ``stepbarrier.aio``, ``stepbarrier.errors``,
``stepbarrier.tf_hooks``, ``stepbarrier.keras_callbacks`` and ``stepbarrier.cli``
(``main`` and ``cli``); every other module has a component with a leading
underscore. The layers are ``[tool.importlinter]`` in pyproject.toml, checked by
``lint-imports`` in ``make lint`` and here; docs/design.md#package-layout is the tree.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import stepbarrier
from tests.conftest import ROOT, subprocess_env

PACKAGE = Path(ROOT, "stepbarrier")
PUBLIC = {
    "stepbarrier",
    "stepbarrier.__main__",
    "stepbarrier.aio",
    "stepbarrier.errors",
    "stepbarrier.tf_hooks",
    "stepbarrier.keras_callbacks",
    "stepbarrier.cli",
    "stepbarrier.cli.__main__",
}
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def modules() -> list[str]:
    """Every module of the package, by its dotted name."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found.append(".".join(parts))
    return found


def test_only_the_public_modules_have_no_private_component() -> None:
    def private(module: str) -> bool:
        return any(part.startswith("_") and part != "__main__" for part in module.split("."))

    assert {module for module in modules() if not private(module)} == PUBLIC


def test_every_private_package_is_a_layer_of_the_contract() -> None:
    # (tomllib is Python 3.11's; the layers are one list of strings)
    text = Path(ROOT, "pyproject.toml").read_text()
    layers = re.findall(r'"([^"]+)"', text.split("\nlayers = [", 1)[1].split("]", 1)[0])
    named = {name.strip() for layer in layers for name in layer.split("|")}
    top = {".".join(m.split(".")[:2]) for m in modules() if m != "stepbarrier"}
    assert top - {"stepbarrier.__main__"} <= named


def lint_imports(cwd: Path, package_parent: Path) -> subprocess.CompletedProcess[str]:
    env = {**subprocess_env(), "PYTHONPATH": str(package_parent)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_import_contracts_hold() -> None:
    result = lint_imports(Path(ROOT), Path(ROOT))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout and result.stdout.count("KEPT") >= 4


@pytest.mark.parametrize(
    ("module", "line", "named"),
    [
        # an upward import, hidden under TYPE_CHECKING
        (
            "_protocol/keys.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from stepbarrier._chief.publisher import StepPublisher\n",
            "stepbarrier._protocol is not allowed to import stepbarrier._chief",
        ),
        # the chief's and the worker's sides are independent
        (
            "_chief/state.py",
            "import stepbarrier._worker.wait_state\n",
            "stepbarrier._chief is not allowed to import stepbarrier._worker",
        ),
        # a cycle inside a package
        (
            "_barriers/wait.py",
            "import stepbarrier._barriers.barrier\n",
            "No cycles are allowed in stepbarrier._barriers",
        ),
        # I/O in the protocol
        ("_protocol/wire.py", "import redis\n", "stepbarrier._protocol.wire -> redis"),
    ],
)
def test_the_contracts_catch_what_they_forbid(
    tmp_path: Path, module: str, line: str, named: str
) -> None:
    shutil.copytree(PACKAGE, tmp_path / "stepbarrier", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(Path(ROOT, "pyproject.toml"), tmp_path / "pyproject.toml")
    target = tmp_path / "stepbarrier" / module
    target.write_text(target.read_text() + "\n" + line)  # an import at the end is valid
    result = lint_imports(tmp_path, tmp_path)
    assert result.returncode != 0
    assert named in re.sub(r"\s+", " ", result.stdout), result.stdout


def test_the_design_page_shows_the_tree() -> None:
    page = Path(ROOT, "docs", "design.md").read_text()
    block = page.split("## Package layout", 1)[1].split("```", 2)[1]
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        shown = relative.name if relative.name != "__init__.py" else f"{relative.parent.name}/"
        assert shown in block, f"docs/design.md#package-layout does not show {relative}"


def test_the_cli_package_binds_the_group_and_main_only() -> None:
    """A command bound in the package would hide the module of the same name."""
    import stepbarrier.cli
    import stepbarrier.cli._exporter

    assert stepbarrier.cli.__all__ == ["cli", "main"]
    assert isinstance(stepbarrier.cli._exporter, type(stepbarrier))


def test_the_top_level_exports_only_public_names() -> None:
    assert all(not name.startswith("_") or name == "__version__" for name in stepbarrier.__all__)
    for name in stepbarrier.__all__:
        assert hasattr(stepbarrier, name), name


def test_import_stepbarrier_loads_neither_click_nor_rich_nor_the_cli() -> None:
    code = (
        "import sys, stepbarrier; "
        "loaded = [m for m in ('click', 'rich', 'stepbarrier.cli', 'tensorflow') "
        "if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], env=subprocess_env(), check=True, timeout=60)
