"""Render the README's pictures of the PR-comment chart and the HTML report.

    python docs/render_pictures.py     # rewrites docs/pr-chart.svg and docs/report.png

Both come from two summaries the tracer wrote for the examples (tests/gate/data): base
``compute_bound.json``, head ``input_bound_b.json`` -- as if a change had made the input
pipeline the bottleneck. ``pr-chart.svg`` is mermaid's own drawing of the chart that
``traceml-ci diff --format markdown`` puts in the comment; ``report.png`` is the top of the page
``traceml-ci report`` writes, as Debian's chromium shows it. Needs what tests/browser needs:
playwright, chromium, and mermaid's bundle in .cache/node (see .ci/setup).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "gate" / "data"
BASE, HEAD = DATA / "compute_bound.json", DATA / "input_bound_b.json"
MERMAID_JS = ROOT / ".cache" / "node" / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"


def _chart() -> str:
    from traceml_ci.gate import compare, load_input, render_markdown

    (base,), (head,) = load_input(BASE).values(), load_input(HEAD).values()
    (chart,) = re.findall(r"```mermaid\n(.*?)```", render_markdown(compare(base, head)), flags=re.S)
    return chart


def _standalone(svg: str) -> str:
    """Mermaid's SVG sized by its viewBox (it is drawn to fit a page) on a white ground, so it
    reads the same as an image in a light or a dark README."""
    _, _, w, h = re.search(r'viewBox="([^"]+)"', svg).group(1).split()  # type: ignore[union-attr]
    svg = svg.replace('width="100%"', f'width="{w}" height="{h}"', 1)
    start = svg.index(">") + 1
    return svg[:start] + '<rect width="100%" height="100%" fill="white"/>' + svg[start:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="folder to write to")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    from traceml_ci.cli.main import main as cli

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None or not MERMAID_JS.is_file():
        print("needs chromium on PATH and mermaid in .cache/node (see .ci/setup)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 900, "height": 700}, device_scale_factor=1)
        host = Path(tmp) / "mermaid.html"
        host.write_text(f"<!doctype html><body><script src='{MERMAID_JS.as_uri()}'></script>")
        page.goto(host.as_uri())
        svg = page.evaluate(
            """async (t) => {
            mermaid.initialize({startOnLoad: false, securityLevel: 'strict'});
            return (await mermaid.render('traceml-chart', t)).svg; }""",
            _chart(),
        )
        (args.out / "pr-chart.svg").write_text(_standalone(svg) + "\n", encoding="utf-8")
        report = Path(tmp) / "report.html"
        os.chdir(ROOT)  # the page names its inputs as given: relative, as a user would
        if (
            cli(
                [
                    "report",
                    str(BASE.relative_to(ROOT)),
                    str(HEAD.relative_to(ROOT)),
                    "-o",
                    str(report),
                ]
            )
            != 0
        ):
            return 1
        page.set_viewport_size({"width": 1000, "height": 1250})
        page.goto(report.as_uri())
        page.screenshot(path=str(args.out / "report.png"))
        browser.close()
    print(f"wrote {args.out / 'pr-chart.svg'} and {args.out / 'report.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
