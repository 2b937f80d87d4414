"""Every file of examples/ is in the examples table of docs/tensorflow-keras.md,
with a test file that exists and runs it (names it)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT

TABLE_PAGE = Path(ROOT) / "docs" / "tensorflow-keras.md"


def example_rows() -> dict[str, str]:
    """``examples/<file>`` -> its table row's "run by" cell."""
    section = TABLE_PAGE.read_text().split("\n## Examples\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(examples/[^`]+)` \|.*\| ([^|]+) \|$", section, re.MULTILINE)
    return dict(rows)


def test_every_example_is_listed_with_the_tests_that_run_it() -> None:
    rows = example_rows()
    shipped = {
        f"examples/{path.name}"
        for path in Path(ROOT, "examples").iterdir()
        if path.suffix in (".py", ".sh")
    }
    assert shipped == set(rows)
    for example, run_by in rows.items():
        tests = re.findall(r"`(tests/[^`]+\.py)`", run_by)
        assert tests, (example, run_by)
        name = Path(example).name
        assert any(name in Path(ROOT, test).read_text() for test in tests), (example, tests)
