"""The README is a front page, and every pointer into the docs site leads somewhere.

Comments, docstrings and messages across the repository point at the docs as
``docs/<page>.md`` or ``docs/<page>.md#<anchor>``; these tests check that each
page exists and each anchor is a heading of it, as mkdocs' ``toc`` extension
slugifies it. ``make docs`` (``mkdocs build --strict``) checks the links inside
docs/ itself.
"""

from __future__ import annotations

import re
import subprocess
import unicodedata
from functools import cache
from pathlib import Path

import pytest

from tests import conftest

ROOT = Path(conftest.ROOT).resolve()
DOCS = ROOT / "docs"
README_MAX_LINES = 250

PAGES = (
    "index.md",
    "getting-started.md",
    "tensorflow-keras.md",
    "python-api.md",
    "configuration.md",
    "cli.md",
    "operations.md",
    "performance.md",
    "reliability-security.md",
    "design.md",
    "changelog.md",
)
"""The pages whose names code and configuration comments rely on."""

FIXED_ANCHORS = {
    "operations.md": (
        "passwords",
        "redis-users-and-acl",
        "monitoring",
        "redis-cluster",
        "kubernetes",
        "docker-compose",
        "tls",
        "sentinel",
    ),
    "design.md": ("keys",),
}
"""Headings that code and deployment files point at."""

REFERENCE = re.compile(r"docs/((?:[\w-]+/)*[\w-]+\.md)(?:#([\w-]+))?")
# A pointer to a README section ("README.md, "Passwords"", "see the README")
# instead of a docs page. Built from parts so that this file does not match it.
README_POINTER = re.compile(
    "README" + r"""(?:\.md)?(?:,\s*["']|'s\s+section)|see\s+the\s+""" + "README\\b"
)
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SNIPPET = re.compile(r"""^--8<--\s+["']([^"']+)["']\s*$""")


def slugify(text: str) -> str:
    """A heading's anchor as Python-Markdown's toc extension makes it."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def click_anchors() -> set[str]:
    """The headings mkdocs-click writes for the ``stepbarrier`` command tree."""
    from stepbarrier.cli import cli

    anchors: set[str] = set()

    def walk(command: object, path: list[str]) -> None:
        anchors.add(slugify(" ".join(path)))
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(cli, ["stepbarrier"])
    return anchors


def markdown_anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings, outside code blocks."""
    anchors: set[str] = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        included = SNIPPET.match(line)
        if included:
            anchors |= markdown_anchors(ROOT / included.group(1))
            continue
        if line.strip() == "::: mkdocs-click":
            anchors |= click_anchors()
            continue
        heading = HEADING.match(line)
        if heading:
            text = heading.group(2)
            explicit = re.search(r"\{[^}]*#([\w-]+)[^}]*\}\s*$", text)
            anchors.add(explicit.group(1) if explicit else slugify(text))
    return anchors


@cache
def page_anchors(page: str) -> frozenset[str]:
    return frozenset(markdown_anchors(DOCS / page))


NOT_SOURCES = {".git", ".venv", "site", "dist", "build", "__pycache__"}
"""Outside a git checkout (an unpacked sdist): folders that are not the project's files."""


def repository_file_names() -> list[str]:
    """Every file git knows or would add (tracked, or new and not ignored); in an
    unpacked sdist, which has no .git, every file of the tree but local state."""
    if not (ROOT / ".git").exists():
        return [
            path.relative_to(ROOT).as_posix()
            for path in ROOT.rglob("*")
            if not NOT_SOURCES.intersection(path.relative_to(ROOT).parts)
            and not any(part.endswith("_cache") for part in path.relative_to(ROOT).parts)
        ]
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return list(filter(None, listed.split("\0")))


def repository_text_files() -> list[Path]:
    """Every text file of the project (see ``repository_file_names``) but docs/."""
    files = []
    for name in sorted(set(repository_file_names())):
        path = ROOT / name
        if name.startswith("docs/") or not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        files.append(path)
    return files


def broken_references(path: Path) -> list[str]:
    problems = []
    text = path.read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), start=1):
        for match in REFERENCE.finditer(line):
            page, anchor = match.groups()
            where = f"{path.relative_to(ROOT)}:{number}: {match.group(0)}"
            if not (DOCS / page).is_file():
                problems.append(f"{where}: no page docs/{page}")
            elif anchor and anchor not in page_anchors(page):
                problems.append(f"{where}: no heading #{anchor} in docs/{page}")
    return problems


def test_the_readme_is_a_front_page_of_at_most_250_lines() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES


def test_the_readme_links_to_every_guide_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {match.group(1) for match in REFERENCE.finditer(readme)}
    missing = [page for page in PAGES if page != "changelog.md" and page not in linked]
    assert missing == []


def test_the_readme_s_own_anchors_are_its_headings() -> None:
    """The in-page links ("pick your path" and others) lead to headings of the README."""
    readme = ROOT / "README.md"
    anchors = set(re.findall(r"\]\(#([\w-]+)\)", readme.read_text(encoding="utf-8")))
    assert {"quick-start-tensorflow", "quick-start-keras", "the-two-commands"} <= anchors
    assert sorted(anchors - markdown_anchors(readme)) == []


def test_every_fixed_page_exists() -> None:
    assert [page for page in PAGES if not (DOCS / page).is_file()] == []


@pytest.mark.parametrize("page", sorted(FIXED_ANCHORS))
def test_the_headings_code_points_at_exist(page: str) -> None:
    missing = [anchor for anchor in FIXED_ANCHORS[page] if anchor not in page_anchors(page)]
    assert missing == []


def test_every_docs_pointer_in_the_repository_leads_to_a_page_and_heading() -> None:
    problems = [problem for path in repository_text_files() for problem in broken_references(path)]
    assert problems == []


def test_no_pointer_to_a_readme_section_is_left() -> None:
    this_file = Path(__file__).resolve()
    leftovers = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in repository_text_files()
        if path != this_file
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if README_POINTER.search(line)
    ]
    assert leftovers == []


def test_the_performance_page_shows_plots_that_make_bench_wrote() -> None:
    # docs/hooks/bench_results.py publishes bench/results as the site's bench/
    # folder, so the page's bench/<name>.png is bench/results/<name>.png itself.
    page = (DOCS / "performance.md").read_text(encoding="utf-8")
    shown = re.findall(r"!\[[^\]]*\]\(bench/([\w.-]+\.png)\)", page)
    assert shown, "the performance page shows no plot"
    assert [name for name in shown if not (ROOT / "bench" / "results" / name).is_file()] == []


def test_slugify_matches_mkdocs_toc() -> None:
    assert slugify("Redis users and ACL") == "redis-users-and-acl"
    assert slugify("`TF_CONFIG` fallback") == "tf_config-fallback"
    assert slugify("8. Redis Cluster beside standalone Redis") == (
        "8-redis-cluster-beside-standalone-redis"
    )
    assert slugify("Fleet scale and the chief's cost") == "fleet-scale-and-the-chiefs-cost"


def test_the_results_page_shows_no_raw_python_values() -> None:
    """bench/report.py writes mappings and lists as text (``fcall 24``, ``0.48 / 2.7``)."""
    page = Path(ROOT, "bench", "results", "results.md").read_text()
    for raw in ("{'", "': [", "[0.", "[1.", "': {"):
        assert raw not in page, f"raw Python value {raw!r} in bench/results/results.md"


def test_the_cli_pages_exit_codes_are_the_commands_own() -> None:
    """docs/cli.md's exit-code table (with more words) lists exactly the codes the
    commands' epilogs draw from (``cli._context._EXIT_TEXT``): a code added to one
    and not the other fails here."""
    from stepbarrier.cli._context import _EXIT_TEXT

    page = (ROOT / "docs" / "cli.md").read_text()
    table = page.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", table, flags=re.M)}
    assert documented == set(_EXIT_TEXT), sorted(documented ^ set(_EXIT_TEXT))
