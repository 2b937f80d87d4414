"""The documentation site builds strictly, reads as a library's reference, and renders.

One ``mkdocs build --strict`` into a temporary folder (as ``make docs`` does
into site/), then:

- no raw reST or doctest markup is left in the HTML outside code: ``# doctest``
  directives, ``.. warning::``-style directives, a ``::`` literal-block marker
  ending a paragraph, ``:class:``-style roles, double-backtick literals,
  ``>>>`` prompts rendered as quotes;
- every public name (``__all__``) of the public modules has its entry on its
  API reference page, the public classes before the tuning constants;
- in a real headless Chromium (Debian's ``chromium``; ``make test`` installs it),
  the home page, getting started, the TensorFlow page, the API reference and the
  pages with diagrams load without error, show their main content, and every
  mermaid diagram has become an SVG (mermaid renders in the browser).
"""

from __future__ import annotations

import ast
import functools
import http.server
import io
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import conftest

ROOT = Path(conftest.ROOT).resolve()
MKDOCS = Path(sys.executable).parent / "mkdocs"

CODE = re.compile(r"<(pre|code|script|style|svg|textarea)\b.*?</\1>", re.S | re.I)
BLOCK_END = re.compile(r"</(?:p|li|td|th|h\d|div|dd|dt|summary|blockquote)>", re.I)
TAG = re.compile(r"<[^>]+>")
RAW_MARKUP = {
    "doctest directive": re.compile(r"#\s*doctest:"),
    "reST directive": re.compile(r"^\s*\.\.\s+[\w-]+::", re.M),
    "reST literal-block marker": re.compile(r"\S::\s*$", re.M),
    "reST role": re.compile(r":(?:class|func|meth|attr|mod|exc|data|obj|ref|py:\w+):`"),
    "reST double-backtick literal": re.compile(r"``"),
    "doctest prompt outside code": re.compile(r"^\s*(?:&gt;){3}\s", re.M),
}

PUBLIC_MODULES = {
    "stepbarrier": ("stepbarrier/__init__.py", "reference/core/index.html"),
    "stepbarrier.aio": ("stepbarrier/aio.py", "reference/aio/index.html"),
    "stepbarrier.errors": ("stepbarrier/errors.py", "reference/errors/index.html"),
    "stepbarrier.tf_hooks": ("stepbarrier/tf_hooks.py", "reference/tensorflow/index.html"),
    "stepbarrier.keras_callbacks": (
        "stepbarrier/keras_callbacks.py",
        "reference/keras/index.html",
    ),
}
ERROR_NAMES = {
    "StepBarrierError",
    "ConfigurationError",
    "BarrierTimeout",
    "BarrierAborted",
    "RedisUnavailable",
    "RedisRefused",
}
"""Re-exported by ``stepbarrier``; documented once, on the errors page."""

BROWSER_PAGES = {
    "": 1,  # the home page, with its architecture diagram
    "getting-started/": 0,
    "tensorflow-keras/": 0,
    "reference/": 0,
    "reference/core/": 0,
    "reference/tensorflow/": 0,
    "design/": 2,
    "protocol/": 3,
    "troubleshooting/": 0,
}
"""Page -> the least number of mermaid diagrams it must show as SVG."""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-6000:]}"
    return out


def prose(html: str) -> str:
    """A page's text outside code, one line per paragraph, cell or heading."""
    html = re.sub(r"<!--.*?-->", "", html, flags=re.S)
    return TAG.sub("", BLOCK_END.sub("\n", CODE.sub(" ", html)))


def raw_markup(text: str) -> list[str]:
    found = []
    for name, pattern in RAW_MARKUP.items():
        for match in pattern.finditer(text):
            start = text.rfind("\n", 0, match.start()) + 1
            end = text.find("\n", match.end())
            found.append(f"{name}: {text[start : end if end >= 0 else None].strip()[:140]!r}")
    return found


def public_names(source: str) -> list[str]:
    tree = ast.parse((ROOT / source).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return [name for name in ast.literal_eval(node.value) if name != "__version__"]
    return [
        node.name
        for node in tree.body
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and not node.name.startswith("_")
    ]


def test_the_site_builds_strictly(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "troubleshooting" / "index.html").is_file()


def test_the_raw_markup_check_finds_what_it_looks_for() -> None:
    html = (
        "<p>Use ``name`` and :class:`X`, like this::</p><pre>ok `` # doctest: +SKIP</pre>"
        "<blockquote><p>&gt;&gt;&gt; x = 1  # doctest: +SKIP</p></blockquote><p>.. warning::</p>"
    )
    kinds = {problem.split(":")[0] for problem in raw_markup(prose(html))}
    assert kinds == set(RAW_MARKUP)
    assert raw_markup(prose("<p>A <code>a::b</code> and <code>``</code>.</p>")) == []


def test_no_raw_rest_or_doctest_markup_is_left_in_the_html(site: Path) -> None:
    problems = [
        f"{page.relative_to(site)}: {problem}"
        for page in sorted(site.rglob("*.html"))
        for problem in raw_markup(prose(page.read_text(encoding="utf-8")))
    ]
    assert problems == []


def test_docstring_examples_render_as_code_blocks(site: Path) -> None:
    # "Example:" admonitions hold fenced code; "Examples:" sections hold
    # doctests (runnable ones: no +SKIP), which griffe renders as code blocks
    for page in ("reference/core/index.html", "reference/tensorflow/index.html"):
        html = (site / page).read_text(encoding="utf-8")
        examples = re.findall(r'<details class="example".*?</details>', html, flags=re.S)
        assert examples, page
        assert [e[:300] for e in examples if '<div class="highlight">' not in e] == [], page
        assert "<blockquote>" not in "".join(examples), page


@pytest.mark.parametrize("module", sorted(PUBLIC_MODULES))
def test_every_public_name_is_in_the_api_reference(site: Path, module: str) -> None:
    source, page = PUBLIC_MODULES[module]
    html = (site / page).read_text(encoding="utf-8")
    errors_html = (site / PUBLIC_MODULES["stepbarrier.errors"][1]).read_text(encoding="utf-8")
    missing = []
    for name in public_names(source):
        if module == "stepbarrier" and name in ERROR_NAMES:
            if f'id="stepbarrier.errors.{name}"' not in errors_html:
                missing.append(f"stepbarrier.errors.{name}")
        elif f'id="{module}.{name}"' not in html:
            missing.append(f"{module}.{name}")
    assert missing == []


def test_the_tensorflow_reference_opens_with_the_hooks(site: Path) -> None:
    html = (site / "reference/tensorflow/index.html").read_text(encoding="utf-8")
    order = re.findall(r'<h3 id="stepbarrier\.tf_hooks\.(\w+)"', html)
    assert order[:3] == ["GlobalStepWaiterHook", "GlobalStepPublisherHook", "hooks_from_env"]
    assert order.index("FETCH_EVERY") > order.index("EndBarrierHook")


def test_mermaid_blocks_become_diagrams() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "name: mermaid" in config and "pymdownx.superfences.fence_code_format" in config
    assert "assets/javascripts/mermaid" in config


# --- the site in a real browser ---------------------------------------------

# Injected into every page the test server sends (never into the site): makes
# mkdocs-material's closed shadow roots open, and marks each mermaid host with
# the width of its SVG and any mermaid error, so that --dump-dom shows them.
PROBE = b"""<script>(function () {
  var attach = Element.prototype.attachShadow;
  Element.prototype.attachShadow = function (init) {
    return attach.call(this, Object.assign({}, init, {mode: "open"}));
  };
  window.addEventListener("error", function (event) {
    document.documentElement.setAttribute("data-test-js-error", String(event.message));
  });
  setInterval(function () {
    document.querySelectorAll("div.mermaid").forEach(function (host) {
      var root = host.shadowRoot || host, svg = root.querySelector("svg");
      if (!svg) return;
      host.setAttribute("data-test-svg", String(Math.round(svg.getBoundingClientRect().width)));
      if (/Syntax error|Parse error/i.test(svg.textContent || "")) {
        host.setAttribute("data-test-mermaid-error", "1");
      }
    });
  }, 50);
})();</script>"""


class _Handler(http.server.SimpleHTTPRequestHandler):
    def send_head(self):  # type: ignore[no-untyped-def]
        path = Path(self.translate_path(self.path))
        if path.is_dir():
            path = path / "index.html"
        if path.suffix != ".html" or not path.is_file():
            return super().send_head()
        data = path.read_bytes().replace(b"</head>", PROBE + b"</head>", 1)
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        return io.BytesIO(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Handler, directory=str(site))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is missing: `make test` installs it (apt-get install chromium)")
    return found


def browse(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--window-size=1280,2400",
            "--virtual-time-budget=20000",
            *extra,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("page", sorted(BROWSER_PAGES), ids=lambda page: page or "home")
def test_the_page_renders_in_a_headless_browser(served: str, page: str, tmp_path: Path) -> None:
    result = browse(served + page, "--dump-dom")
    dom = result.stdout
    assert result.returncode == 0 and "</html>" in dom, result.stderr[-3000:]
    assert 'data-test-js-error="' not in dom, re.findall(r'data-test-js-error="[^"]*"', dom)
    main = re.search(r'<article class="md-content__inner[^"]*"[^>]*>(.*?)</article>', dom, re.S)
    assert main is not None, "no main content"
    assert len(prose(main.group(1)).split()) >= 20, "the main content is (nearly) empty"
    widths = [int(w) for w in re.findall(r'<div class="mermaid"[^>]*data-test-svg="(\d+)"', dom)]
    assert len(widths) >= BROWSER_PAGES[page], f"{len(widths)} diagrams rendered as SVG"
    assert all(width > 50 for width in widths), widths
    assert 'data-test-mermaid-error="' not in dom
    assert '<pre class="mermaid"' not in dom, "a mermaid block was left unrendered"


@pytest.mark.parametrize(
    "page", ["", "getting-started/", "tensorflow-keras/", "reference/core/"], ids=str
)
def test_a_screenshot_of_the_page_shows_a_rendered_page(
    served: str, page: str, tmp_path: Path
) -> None:
    from PIL import Image

    shot = tmp_path / "page.png"
    result = browse(served + page, f"--screenshot={shot}")
    assert result.returncode == 0 and shot.is_file(), result.stderr[-3000:]
    with Image.open(shot) as image:
        assert image.size == (1280, 2400)
        small = image.convert("RGB").resize((128, 240))
        colours = small.getcolors(maxcolors=128 * 240) or []
    # a blank or error page has a handful of colours; text, the header bar and
    # code blocks give hundreds
    assert len(colours) > 40, f"{len(colours)} colours: the page looks blank"
