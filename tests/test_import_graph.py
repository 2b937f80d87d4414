"""The top-level modules of stepbarrier import each other without a cycle.

A cycle is what invites an import hidden inside a function to dodge it, so
imports inside functions count too; only ``if TYPE_CHECKING:`` imports, which
never run, are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = Path(ROOT) / "stepbarrier"


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The top-level stepbarrier modules that ``path`` imports, wherever in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from stepbarrier import waiter`` imports the module ``waiter``
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "stepbarrier" and len(parts) > 1 and parts[1] in modules:
                found.add(parts[1])
    return found - {path.stem}


def import_graph() -> dict[str, set[str]]:
    modules = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    return {name: imported_modules(PACKAGE / f"{name}.py", modules) for name in sorted(modules)}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or ``None``."""
    done: set[str] = set()
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        if name in path:
            return [*path[path.index(name) :], name]
        if name in done:
            return None
        path.append(name)
        for imported in sorted(graph[name]):
            cycle = visit(imported)
            if cycle is not None:
                return cycle
        path.pop()
        done.add(name)
        return None

    for name in graph:
        cycle = visit(name)
        if cycle is not None:
            return cycle
    return None


def test_the_top_level_modules_import_each_other_without_a_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_an_import_inside_a_function_counts_and_a_type_checking_one_does_not(
    tmp_path: Path,
) -> None:
    source = tmp_path / "sample.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from stepbarrier import keys\n"
        "if TYPE_CHECKING:\n"
        "    from stepbarrier.waiter import StepWaiter\n"
        "def later():\n"
        "    from stepbarrier.config import BarrierConfig\n"
        "    import stepbarrier.status\n"
    )
    modules = {"keys", "waiter", "config", "status"}
    assert imported_modules(source, modules) == {"keys", "config", "status"}


def test_a_cycle_is_found_and_named_as_a_path() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
