"""Publish bench/results as the site's bench/ folder: the report and plots as
`make bench` wrote them, never copies that could drift from them.

An mkdocs hook (mkdocs.yml, `hooks:`): bench/results/results.md becomes the page
bench/results.md, and its plots and JSON files are served beside it, so the
report's own image links and the performance page's links resolve.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

PUBLISHED = {".md", ".png", ".json"}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    results = Path(config.config_file_path).parent / "bench" / "results"
    for path in sorted(results.iterdir()):
        if path.is_file() and path.suffix in PUBLISHED:
            files.append(File.generated(config, f"bench/{path.name}", abs_src_path=str(path)))
    return files
