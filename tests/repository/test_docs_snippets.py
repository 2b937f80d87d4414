"""Every Python and shell block of the README and docs/*.md runs as pasted.

Each ```python, ```sh, ```bash and ```shell block runs in a new process from the
checkout's top folder, with a clean environment, as a newcomer's shell would
have it: ``PATH`` (the virtual environment's ``bin`` first, as after
``. .venv/bin/activate``), ``HOME``, the locale, ``PYTHONPATH`` naming this
checkout (the installed package), and nothing of ``STEPBARRIER_*`` nor
``TF_CONFIG`` but what the page itself shows: a shell block made only of
``export`` lines sets its variables for the blocks after it in the same
section (``##`` heading), as a reader who pasted it into their shell has them.

Redis is "a Redis on localhost": a redis-server this module starts, on a free
port, since a test never takes a fixed one. That port is the one thing the test
changes: ``localhost:6379`` (and ``127.0.0.1:6379``) in a block's text becomes
``localhost:<port>``, and the library's default URL, ``redis://localhost:6379/0``,
reaches the same server through ``STEPBARRIER_REDIS_URL`` set to it with that
port, which a page's own ``export STEPBARRIER_REDIS_URL=...`` overrides. A
block that needs a variable its page does not show, a role, a job, another
host, fails here as it would for a reader.

A block that cannot run so says why in an HTML comment on the line just before
its fence::

    <!-- not run: needs kubectl and a Kubernetes cluster -->

(docs/getting-started.md#snippets-in-these-pages). ```console and ```text
blocks are transcripts, never run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stepbarrier._config.defaults import DEFAULT_REDIS_URL
from tests import conftest
from tests.redis_harness import RedisServer

ROOT = Path(conftest.ROOT).resolve()
RUN = {"python": "python", "py": "python", "sh": "shell", "bash": "shell", "shell": "shell"}
FENCE = re.compile(r"^(?P<indent>[ ]*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)[^\n]*$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->\s*$")
SECTION = re.compile(r"^##\s")
EXPORT = re.compile(r"^export\s+[A-Za-z_]\w*=")
DEFAULT_PORT = re.compile(r"(?<=redis://)(localhost|127\.0\.0\.1):6379\b")
KEPT_VARIABLES = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR")
"""What a newcomer's shell has besides what the page shows."""
GIVEN_A_JOB = frozenset({"docs/python-api.md"})
"""Pages whose blocks do not show their job and role yet: the test still gives
them a fresh ``STEPBARRIER_JOB`` and ``STEPBARRIER_ROLE=chief``, as it once gave
every page. Once a page's blocks show what they need, remove it from here."""
AS_PASTED = ("README.md", "docs/getting-started.md", "docs/index.md", "docs/tensorflow-keras.md")
"""Pages that a newcomer pastes from first: never in ``GIVEN_A_JOB``."""
SNIPPET_TIMEOUT = 240
MAX_NOT_RUN = 25
"""Keep the excepted blocks few: raising this needs a reason in review."""


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int
    lang: str
    code: str
    not_run: str | None
    section: str = ""
    """The ``##`` heading the block is under ("" before the first)."""

    @property
    def where(self) -> str:
        return f"{self.page or self.path}:{self.line}"

    @property
    def page(self) -> str:
        return self.path.relative_to(ROOT).as_posix() if self.path.is_relative_to(ROOT) else ""

    @property
    def sets_variables(self) -> bool:
        """A runnable shell block of ``export`` lines only: its variables hold after it."""
        lines = [line.strip() for line in self.code.splitlines()]
        lines = [line for line in lines if line and not line.startswith("#")]
        return (
            self.lang == "shell"
            and self.not_run is None
            and bool(lines)
            and all(EXPORT.match(line) for line in lines)
        )


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def snippets(path: Path) -> Iterator[Snippet]:
    """The fenced blocks of a Markdown file, with the "not run" comment before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    section = ""
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            if SECTION.match(lines[index]):
                section = lines[index].strip()
            index += 1
            continue
        indent, fence, lang = opening["indent"], opening["fence"], opening["lang"].lower()
        body: list[str] = []
        end = index + 1
        while end < len(lines) and not (
            lines[end].startswith(indent + fence[0] * len(fence))
            and lines[end].strip() == fence[0] * len(lines[end].strip())
        ):
            body.append(lines[end][len(indent) :] if lines[end].startswith(indent) else lines[end])
            end += 1
        previous = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        marker = NOT_RUN.match(previous)
        if lang in RUN:
            code = "\n".join(body) + "\n"
            yield Snippet(path, index + 1, RUN[lang], code, marker and marker["reason"], section)
        index = end + 1


def shown_variables(snippet: Snippet, page: list[Snippet]) -> str:
    """The ``export`` blocks before ``snippet`` in its section of ``page``, as shell lines."""
    return "".join(
        block.code
        for block in page
        if block.section == snippet.section and block.line < snippet.line and block.sets_variables
    )


def pasted_env(port: int, page: str = "") -> dict[str, str]:
    """A newcomer's environment: ``KEPT_VARIABLES``, the checkout installed, the venv active."""
    env = {name: os.environ[name] for name in KEPT_VARIABLES if name in os.environ}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", os.defpath)
    env["PYTHONPATH"] = str(ROOT)
    # the default URL, on the test's port (a page's own export overrides it)
    env["STEPBARRIER_REDIS_URL"] = on_port(DEFAULT_REDIS_URL, port)
    if page in GIVEN_A_JOB:
        env.update(STEPBARRIER_JOB=f"docs-{uuid.uuid4().hex[:10]}", STEPBARRIER_ROLE="chief")
    return env


def on_port(text: str, port: int) -> str:
    """``text`` with each ``redis://localhost:6379`` on ``port`` instead."""
    return DEFAULT_PORT.sub(lambda found: f"{found[1]}:{port}", text)


def run_as_pasted(
    snippet: Snippet, page: list[Snippet], port: int
) -> subprocess.CompletedProcess[str]:
    """Run ``snippet`` after its page's ``export`` blocks, in ``pasted_env``."""
    shown = on_port(shown_variables(snippet, page), port)
    code = on_port(snippet.code, port)
    if snippet.lang == "python":  # python -c, from the shell the exports ran in
        script = shown + 'exec python -c "$1"\n'
    else:
        script, code = shown + code, ""
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script, "bash", code],
        cwd=ROOT,
        env=pasted_env(port, snippet.page),
        capture_output=True,
        text=True,
        timeout=SNIPPET_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )


PAGES = {path: list(snippets(path)) for path in markdown_files()}
ALL = [snippet for page in PAGES.values() for snippet in page]
RUNNABLE = [snippet for snippet in ALL if snippet.not_run is None]


@pytest.fixture(scope="module")
def snippet_redis() -> Iterator[RedisServer]:
    """A redis-server of this module's own, emptied before each snippet."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


def test_the_snippets_are_found() -> None:
    counts = {lang: sum(s.lang == lang for s in RUNNABLE) for lang in ("python", "shell")}
    assert counts["python"] >= 8 and counts["shell"] >= 2, counts


def test_excepted_snippets_are_few_and_say_why() -> None:
    excepted = [f"{s.where}: {s.not_run}" for s in ALL if s.not_run is not None]
    assert len(excepted) <= MAX_NOT_RUN, "\n".join(excepted)
    assert all(len(s.not_run or "") >= 10 for s in ALL if s.not_run is not None)


def test_the_pages_a_newcomer_starts_from_are_run_as_pasted() -> None:
    assert not GIVEN_A_JOB.intersection(AS_PASTED)
    assert all((ROOT / page).is_file() for page in (*AS_PASTED, *GIVEN_A_JOB))


def test_the_fence_parser_reads_markers_languages_and_sections(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- not run: needs kubectl and a cluster -->\n```sh\nkubectl get pods\n```\n\n"
        "## Two\n\n```python\nprint(1)\n```\n\n```console\n$ ls\n```\n",
        encoding="utf-8",
    )
    found = list(snippets(page))
    assert [(s.lang, s.code, s.not_run, s.section) for s in found] == [
        ("shell", "kubectl get pods\n", "needs kubectl and a cluster", ""),
        ("python", "print(1)\n", None, "## Two"),
    ]


READS_A_JOB = (
    "from stepbarrier import BarrierConfig\n"
    "config = BarrierConfig.from_env()\n"
    "assert config.role == 'chief' and config.job == 'shown', config\n"
    "assert config.redis_url.endswith(':{port}/0'), config.redis_url\n"
)


def test_a_snippet_gets_only_the_variables_its_section_shows(
    tmp_path: Path, snippet_redis: RedisServer
) -> None:
    """The runner's own check: what the page does not show, the snippet does not get."""
    page = tmp_path / "page.md"
    page.write_text(
        "## Shown\n\n```sh\nexport STEPBARRIER_JOB=shown STEPBARRIER_ROLE=chief   # a comment\n"
        "export STEPBARRIER_REDIS_URL=redis://localhost:6379/0\n```\n\n"
        f"```python\n{READS_A_JOB}```\n\n## Not shown\n\n```python\n{READS_A_JOB}```\n",
        encoding="utf-8",
    )
    shown, under, elsewhere = list(snippets(page))
    assert shown.sets_variables and not under.sets_variables
    code = READS_A_JOB.replace("{port}", str(snippet_redis.port))
    under, elsewhere = (
        Snippet(s.path, s.line, s.lang, code, None, s.section) for s in (under, elsewhere)
    )
    page_snippets = [shown, under, elsewhere]
    ran = run_as_pasted(under, page_snippets, snippet_redis.port)
    assert ran.returncode == 0, ran.stderr
    missing = run_as_pasted(elsewhere, page_snippets, snippet_redis.port)
    assert missing.returncode != 0
    assert "STEPBARRIER_JOB is required" in missing.stderr, missing.stderr


def test_a_snippet_does_not_inherit_the_test_s_environment(
    monkeypatch: pytest.MonkeyPatch, snippet_redis: RedisServer
) -> None:
    monkeypatch.setenv("STEPBARRIER_JOB", "from-the-test")
    monkeypatch.setenv("TF_CONFIG", '{"task": {"type": "chief", "index": 0}}')
    env = pasted_env(snippet_redis.port)
    assert not {name for name in env if name.startswith("STEPBARRIER_")} - {"STEPBARRIER_REDIS_URL"}
    assert "TF_CONFIG" not in env
    assert env["STEPBARRIER_REDIS_URL"] == f"redis://localhost:{snippet_redis.port}/0"


@pytest.mark.parametrize("snippet", RUNNABLE, ids=[s.where for s in RUNNABLE])
def test_the_snippet_runs_as_pasted(snippet: Snippet, snippet_redis: RedisServer) -> None:
    with snippet_redis.client() as client:
        client.flushall()  # keys only: the Functions library stays loaded
    try:
        result = run_as_pasted(snippet, PAGES[snippet.path], snippet_redis.port)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"{snippet.where} still ran after {SNIPPET_TIMEOUT} s:\n{expired.stderr!r}")
    assert result.returncode == 0, (
        f"{snippet.where} exited {result.returncode}\n--- code\n{snippet.code}"
        f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-6000:]}"
    )
