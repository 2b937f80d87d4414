"""Every Python and shell block of the README and docs/*.md runs as written.

Each ```python, ```sh, ```bash and ```shell block runs in a new process from the
checkout's top folder, against a redis-server this module starts on a free
port: the snippet finds it through ``STEPBARRIER_REDIS_URL``, gets a fresh
``STEPBARRIER_JOB`` and ``STEPBARRIER_ROLE=chief`` (so ``BarrierConfig.from_env()``
takes the chief's branch), and nothing else of ``STEPBARRIER_*``. A block that
cannot run so says why in an HTML comment on the line just before its fence::

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

from tests import conftest
from tests.conftest import subprocess_env
from tests.redis_harness import RedisServer

ROOT = Path(conftest.ROOT).resolve()
RUN = {"python": "python", "py": "python", "sh": "shell", "bash": "shell", "shell": "shell"}
FENCE = re.compile(r"^(?P<indent>[ ]*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)[^\n]*$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->\s*$")
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

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def snippets(path: Path) -> Iterator[Snippet]:
    """The fenced blocks of a Markdown file, with the "not run" comment before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
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
            yield Snippet(
                path, index + 1, RUN[lang], "\n".join(body) + "\n", marker and marker["reason"]
            )
        index = end + 1


ALL = [snippet for path in markdown_files() for snippet in snippets(path)]
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


def test_the_fence_parser_reads_markers_and_languages(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- not run: needs kubectl and a cluster -->\n```sh\nkubectl get pods\n```\n\n"
        "```python\nprint(1)\n```\n\n```console\n$ ls\n```\n",
        encoding="utf-8",
    )
    found = list(snippets(page))
    assert [(s.lang, s.code, s.not_run) for s in found] == [
        ("shell", "kubectl get pods\n", "needs kubectl and a cluster"),
        ("python", "print(1)\n", None),
    ]


@pytest.mark.parametrize("snippet", RUNNABLE, ids=[s.where for s in RUNNABLE])
def test_the_snippet_runs_as_written(snippet: Snippet, snippet_redis: RedisServer) -> None:
    with snippet_redis.client() as client:
        client.flushall()  # keys only: the Functions library stays loaded
    venv_bin = str(Path(sys.executable).parent)
    env = subprocess_env(
        STEPBARRIER_REDIS_URL=snippet_redis.url,
        STEPBARRIER_JOB=f"docs-{uuid.uuid4().hex[:10]}",
        STEPBARRIER_ROLE="chief",
        KERAS_BACKEND="tensorflow",
    )
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    if snippet.lang == "python":
        command = [sys.executable, "-c", snippet.code]
    else:
        command = ["bash", "-e", "-o", "pipefail", "-c", snippet.code]
    try:
        result = subprocess.run(
            command,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=SNIPPET_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"{snippet.where} still ran after {SNIPPET_TIMEOUT} s:\n{expired.stderr}")
    assert result.returncode == 0, (
        f"{snippet.where} exited {result.returncode}\n--- code\n{snippet.code}"
        f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-6000:]}"
    )
