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
  the home page, getting started, the TensorFlow page, the API reference and
  every page with diagrams load without error, show their main content, and
  every mermaid diagram has become an SVG (mermaid renders in the browser) whose
  edge labels neither overlap one another nor stick out of the SVG's viewBox;
- the site works opened from disk: from index.html loaded as a file:// URL,
  every navigation link names a page's file (not a folder, which a browser shows
  as a listing), and the protocol page so reached renders, diagrams included;
- ``make docs-serve`` serves it.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import html
import http.server
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import conftest
from tests.redis_harness import free_port

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
    "stepbarrier": ("stepbarrier/__init__.py", "reference/core.html"),
    "stepbarrier.aio": ("stepbarrier/aio.py", "reference/aio.html"),
    "stepbarrier.errors": ("stepbarrier/errors.py", "reference/errors.html"),
    "stepbarrier.tf_hooks": ("stepbarrier/tf_hooks.py", "reference/tensorflow.html"),
    "stepbarrier.keras_callbacks": (
        "stepbarrier/keras_callbacks.py",
        "reference/keras.html",
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
    "index.html": 1,  # the home page, with its architecture diagram
    "getting-started.html": 0,
    "tensorflow-keras.html": 0,
    "reference/index.html": 0,
    "reference/core.html": 0,
    "reference/tensorflow.html": 0,
    "design.html": 2,
    "protocol.html": 3,
    "troubleshooting.html": 0,
}
"""Page -> the least number of mermaid diagrams it must show as SVG. Every page
with a diagram is here (``test_every_page_with_a_diagram_is_loaded_in_the_browser``).
mkdocs.yml's ``use_directory_urls: false``: a page is its .html file."""


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
    assert (site / "troubleshooting.html").is_file()


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
    for page in ("reference/core.html", "reference/tensorflow.html"):
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
    html = (site / "reference/tensorflow.html").read_text(encoding="utf-8")
    order = re.findall(r'<h3 id="stepbarrier\.tf_hooks\.(\w+)"', html)
    assert order[:3] == ["GlobalStepWaiterHook", "GlobalStepPublisherHook", "hooks_from_env"]
    assert order.index("FETCH_EVERY") > order.index("EndBarrierHook")


def test_mermaid_blocks_become_diagrams() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "name: mermaid" in config and "pymdownx.superfences.fence_code_format" in config
    assert "assets/javascripts/mermaid" in config


# --- the site in a real browser ---------------------------------------------

# Injected into every page the test gives the browser (never into the site):
# makes mkdocs-material's closed shadow roots open, and marks each mermaid host
# with the width of its SVG, any mermaid error, its number of edge labels and
# what is wrong with them, so that --dump-dom shows them. An edge label is wrong
# when it overlaps another (by more than a pixel each way: touching is fine),
# sticks out of the SVG's viewBox (the browser clips it there), or its text
# sticks out of its own box.
PROBE = b"""<script>(function () {
  var attach = Element.prototype.attachShadow;
  Element.prototype.attachShadow = function (init) {
    return attach.call(this, Object.assign({}, init, {mode: "open"}));
  };
  window.addEventListener("error", function (event) {
    document.documentElement.setAttribute("data-test-js-error", String(event.message));
  });
  function overlap(a, b) {
    return Math.min(a.right, b.right) - Math.max(a.left, b.left) > 1 &&
      Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 1;
  }
  function inside(inner, outer) {
    return inner.left >= outer.left - 1 && inner.right <= outer.right + 1 &&
      inner.top >= outer.top - 1 && inner.bottom <= outer.bottom + 1;
  }
  function viewBox(svg) {
    // the viewBox's rectangle on the page: what the browser shows of the drawing
    var box = svg.viewBox && svg.viewBox.baseVal, ctm = svg.getScreenCTM();
    if (!box || !box.width || !box.height || !ctm) return svg.getBoundingClientRect();
    var a = new DOMPoint(box.x, box.y).matrixTransform(ctm);
    var b = new DOMPoint(box.x + box.width, box.y + box.height).matrixTransform(ctm);
    return {left: Math.min(a.x, b.x), top: Math.min(a.y, b.y),
            right: Math.max(a.x, b.x), bottom: Math.max(a.y, b.y)};
  }
  function edgeLabels(svg) {
    var view = viewBox(svg), labels = [], problems = [];
    svg.querySelectorAll("g.edgeLabel").forEach(function (label) {
      var text = (label.textContent || "").replace(/\\s+/g, " ").trim();
      var box = label.getBoundingClientRect();
      if (!text || box.width <= 0 || box.height <= 0) return;  // an edge without a label
      labels.push({text: text, box: box});
      if (!inside(box, view)) problems.push("outside the viewBox: " + text);
      var frame = label.querySelector("foreignObject");
      var content = frame && frame.firstElementChild;
      if (content && !inside(content.getBoundingClientRect(), frame.getBoundingClientRect())) {
        problems.push("cut off by its own box: " + text);
      }
    });
    labels.forEach(function (a, i) {
      labels.slice(i + 1).forEach(function (b) {
        if (overlap(a.box, b.box)) problems.push("overlap: " + a.text + " | " + b.text);
      });
    });
    return {count: labels.length, problems: problems};
  }
  setInterval(function () {
    document.querySelectorAll("div.mermaid").forEach(function (host) {
      var root = host.shadowRoot || host, svg = root.querySelector("svg");
      if (!svg) return;
      host.setAttribute("data-test-svg", String(Math.round(svg.getBoundingClientRect().width)));
      if (/Syntax error|Parse error/i.test(svg.textContent || "")) {
        host.setAttribute("data-test-mermaid-error", "1");
      }
      var labels = edgeLabels(svg);
      host.setAttribute("data-test-edge-labels", String(labels.count));
      host.setAttribute("data-test-label-problems", JSON.stringify(labels.problems));
    });
  }, 50);
})();</script>"""


def with_probe(page: Path) -> bytes:
    return page.read_bytes().replace(b"</head>", PROBE + b"</head>", 1)


class _Handler(http.server.SimpleHTTPRequestHandler):
    def send_head(self):  # type: ignore[no-untyped-def]
        path = Path(self.translate_path(self.path))
        if path.suffix != ".html" or not path.is_file():
            return super().send_head()
        data = with_probe(path)
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        return io.BytesIO(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serving(directory: Path) -> Iterator[str]:
    """``directory`` over HTTP on 127.0.0.1, the probe in every page; its URL."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Handler, directory=str(directory))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    with serving(site) as url:
        yield url


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


def diagrams(dom: str) -> list[dict[str, str]]:
    """Each mermaid host's ``data-test-*`` marks (the probe's), from a dumped DOM."""
    return [
        {
            name: html.unescape(value)
            for name, value in re.findall(r'data-test-([\w-]+)="([^"]*)"', tag)
        }
        for tag in re.findall(r'<div class="mermaid"[^>]*>', dom)
    ]


def label_problems(hosts: list[dict[str, str]]) -> dict[int, list[str]]:
    """Diagram number -> what is wrong with its edge labels (none: not listed)."""
    found = {i: json.loads(host.get("label-problems", "[]")) for i, host in enumerate(hosts)}
    return {i: problems for i, problems in found.items() if problems}


def rendered(result: subprocess.CompletedProcess[str], least_diagrams: int) -> str:
    """Asserts that the browser showed a page of the site, its diagrams drawn and
    their edge labels readable; returns its DOM."""
    dom = result.stdout
    assert result.returncode == 0 and "</html>" in dom, result.stderr[-3000:]
    assert 'data-test-js-error="' not in dom, re.findall(r'data-test-js-error="[^"]*"', dom)
    main = re.search(r'<article class="md-content__inner[^"]*"[^>]*>(.*?)</article>', dom, re.S)
    assert main is not None, "no main content"
    assert len(prose(main.group(1)).split()) >= 20, "the main content is (nearly) empty"
    hosts = diagrams(dom)
    widths = [int(host["svg"]) for host in hosts if "svg" in host]
    assert len(widths) >= least_diagrams, f"{len(widths)} diagrams rendered as SVG"
    assert all(width > 50 for width in widths), widths
    assert not any("mermaid-error" in host for host in hosts)
    assert '<pre class="mermaid"' not in dom, "a mermaid block was left unrendered"
    assert label_problems(hosts) == {}
    return dom


def test_every_page_with_a_diagram_is_loaded_in_the_browser(site: Path) -> None:
    with_diagrams = {
        page.relative_to(site).as_posix()
        for page in site.rglob("*.html")
        if '<pre class="mermaid">' in page.read_text(encoding="utf-8")
    }
    assert "protocol.html" in with_diagrams
    assert with_diagrams - {page for page, least in BROWSER_PAGES.items() if least} == set()


@pytest.mark.parametrize("page", sorted(BROWSER_PAGES))
def test_the_page_renders_in_a_headless_browser(served: str, page: str) -> None:
    dom = rendered(browse(served + page, "--dump-dom"), BROWSER_PAGES[page])
    if page in ("design.html", "protocol.html"):  # flowcharts and state diagrams
        # the label check saw the labels (it passes vacuously on none)
        assert sum(int(host.get("edge-labels", 0)) for host in diagrams(dom)) >= 5


LABEL_CHECK_PAGE = """<!doctype html><html><head><title>labels</title></head><body>
<div class="mermaid"><svg xmlns="http://www.w3.org/2000/svg" width="800" height="400"
  viewBox="0 0 400 200" font-size="10">
<g class="edgeLabel" transform="translate(10,10)"><rect width="100" height="20"/>
  <text y="15">first</text></g>
<g class="edgeLabel" transform="translate(60,15)"><rect width="100" height="20"/>
  <text y="15">second</text></g>
<g class="edgeLabel" transform="translate(160,15)"><rect width="40" height="20"/>
  <text y="15">touching</text></g>
<g class="edgeLabel" transform="translate(350,100)"><rect width="100" height="20"/>
  <text y="15">clipped</text></g>
<g class="edgeLabel" transform="translate(150,50)"><foreignObject width="50" height="12">
  <div xmlns="http://www.w3.org/1999/xhtml" style="width: 50px">a long text, cut off</div>
</foreignObject></g>
<g class="edgeLabel" transform="translate(200,150)"><rect width="60" height="20"/>
  <text y="15">fine</text></g>
<g class="edgeLabel"><rect width="0" height="0"/></g>
</svg></div><article class="md-content__inner">x</article></body></html>
"""
"""Edge labels as mermaid draws them (``g.edgeLabel``, text or HTML), drawn at
twice the viewBox's scale: two that overlap, one that only touches them, one
past the viewBox's right edge, one whose text is taller than its box, one fine,
and an edge without a label."""


def test_the_edge_label_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    (tmp_path / "labels.html").write_text(LABEL_CHECK_PAGE, encoding="utf-8")
    with serving(tmp_path) as url:
        result = browse(url + "labels.html", "--dump-dom")
    assert result.returncode == 0, result.stderr[-3000:]
    [host] = diagrams(result.stdout)
    assert host["edge-labels"] == "6"
    assert sorted(json.loads(host["label-problems"])) == [
        "cut off by its own box: a long text, cut off",
        "outside the viewBox: clipped",
        "overlap: first | second",
    ]


@pytest.fixture(scope="module")
def on_disk(site: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built site copied as it is, but for the probe in each page."""
    copy = tmp_path_factory.mktemp("on-disk") / "site"
    shutil.copytree(site, copy)
    for page in copy.rglob("*.html"):
        page.write_bytes(with_probe(page))
    return copy


def test_the_site_works_opened_from_disk(on_disk: Path) -> None:
    """site/index.html opened in a browser: each link of its navigation names a
    page's file, not a folder (which the browser would show as a listing), and
    the protocol page, reached so, renders with its diagrams (mermaid's script
    and the theme's load from disk; search runs there through the offline
    plugin, without a JavaScript error)."""
    home = rendered(browse(on_disk.joinpath("index.html").as_uri(), "--dump-dom"), 1)
    links = {
        link
        for link in re.findall(r'<a href="([^"#]+)"[^>]*\bclass="md-nav__link\b', home)
        if "://" not in link
    }
    assert len(links) >= len(BROWSER_PAGES), links
    assert sorted(link for link in links if not (on_disk / link).is_file()) == []
    [protocol] = [link for link in links if link.endswith("protocol.html")]
    rendered(browse((on_disk / protocol).as_uri(), "--dump-dom"), BROWSER_PAGES["protocol.html"])


def test_make_docs_serve_serves_the_site(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    dry = subprocess.run(
        ["make", "--no-print-directory", "-n", "docs-serve", f"DOCS_ADDR={address}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    command = shlex.split(dry.stdout.strip().splitlines()[-1])
    assert Path(command[0]).name == "mkdocs" and command[1:] == ["serve", "--dev-addr", address]
    log = tmp_path / "serve.log"
    with log.open("w") as output:
        server = subprocess.Popen(
            [str(MKDOCS), *command[1:]], cwd=ROOT, stdout=output, stderr=subprocess.STDOUT,
            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        )  # fmt: skip
    try:
        page = None
        for _ in range(600):  # the build first: seconds; at most a minute or two
            assert server.poll() is None, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://{address}/protocol.html", timeout=5) as reply:
                    page = reply.read().decode()
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.2)
        assert page is not None, log.read_text()[-3000:]
        assert '<article class="md-content__inner' in page and '<pre class="mermaid">' in page
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.parametrize(
    "page",
    ["index.html", "getting-started.html", "tensorflow-keras.html", "reference/core.html"],
    ids=str,
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
