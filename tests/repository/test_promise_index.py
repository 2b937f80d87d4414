"""The promise -> test index in tests/README.md names every promise and only tests that exist.

The index is a copy of two lists (the invariants of docs/protocol.md and the
sections of the security model); this test is what keeps it from drifting.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INDEX = ROOT / "tests" / "README.md"
#: A section of the security model that is about the tests, not a claim.
NOT_A_CLAIM = {"What proves it"}


def _headings(path: Path, section: str) -> list[str]:
    """The ``###`` headings under the ``## section`` of a docs page."""
    text = path.read_text(encoding="utf-8")
    body = text.split(f"\n## {section}", 1)[1].split("\n## ", 1)[0]
    return [re.sub(r"\s*\{#.*\}$", "", h).strip() for h in re.findall(r"^### (.+)$", body, re.M)]


def _index_sections() -> dict[str, str]:
    text = INDEX.read_text(encoding="utf-8")
    parts = re.split(r"^### (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def test_every_promise_and_security_claim_has_a_section_naming_tests() -> None:
    promises = _headings(ROOT / "docs" / "protocol.md", "Invariants")
    claims = [
        h
        for h in _headings(ROOT / "docs" / "reliability-security.md", "Security")
        if h not in NOT_A_CLAIM
    ]
    assert len(promises) >= 5 and len(claims) >= 7
    sections = _index_sections()
    missing = [h for h in promises + claims if h not in sections]
    assert not missing, f"tests/README.md lists no tests for: {missing}"
    empty = [h for h in promises + claims if "tests/" not in sections[h]]
    assert not empty, f"tests/README.md names no test under: {empty}"


def test_every_test_the_index_names_exists() -> None:
    text = INDEX.read_text(encoding="utf-8")
    current_file: Path | None = None
    named = 0
    for match in re.finditer(
        r"`(tests/[\w/]+\.py)?((?:::)test_\w+)?`(?: and `::(test_\w+)`)?", text
    ):
        path, name, second = match.groups()
        if path:
            current_file = ROOT / path
            assert current_file.is_file(), f"{path} does not exist"
        for test in (name and name[2:], second):
            if test:
                assert current_file is not None
                assert test in _test_names(current_file), (
                    f"{current_file.relative_to(ROOT)} has no {test}"
                )
                named += 1
    assert named >= 60
