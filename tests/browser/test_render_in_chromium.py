"""Mermaid itself, in headless chromium, renders every chart the markdown report can carry.

The mermaid npm package's bundle is loaded from disk into a file:// page (network blocked), each
chart goes through ``mermaid.parse`` and ``mermaid.render``, and the SVG must hold one bar per
phase per side. A control shows the check fails on a chart that mermaid rejects.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.gate.summaries import make, shift
from traceml_ci.gate import compare, compare_sets, render_markdown
from traceml_ci.gate.render.chart import MAX_JOBS, comparison_chart
from traceml_ci.summary.keys import PHASES

HOSTILE = 'a"b`c[d]e{f}g\nh%%{init}%%;<i>&amp;#x1F;\u202e'

_RENDER = """async (text) => {
  mermaid.initialize({startOnLoad: false, securityLevel: 'strict'});
  try {
    await mermaid.parse(text);
    const {svg} = await mermaid.render('chart' + Math.floor(Math.random() * 1e9), text);
    document.getElementById('out').innerHTML = svg;
    return {ok: true, bars: document.querySelectorAll('#out g.bar-plot-0 rect').length,
            series: document.querySelectorAll('#out [class^="bar-plot-"]').length,
            labels: Array.from(document.querySelectorAll('#out .left-axis .label text, '
                    + '#out .bottom-axis .label text')).map(t => t.textContent)};
  } catch (e) { return {ok: false, error: String(e)}; }
}"""


def _open(page: Any, mermaid_js: Path, tmp_path: Path) -> None:
    html = tmp_path / "mermaid.html"
    html.write_text(f"<!doctype html><html><body><div id='out'></div>"
                    f"<script src='{mermaid_js.as_uri()}'></script></body></html>")
    page.goto(html.as_uri())


def _mermaid_blocks(markdown: str) -> list[str]:
    return re.findall(r"```mermaid\n(.*?)```", markdown, flags=re.S)


def _render(page: Any, chart: str) -> dict[str, Any]:
    return page.evaluate(_RENDER, chart)


def _set(n: int, name: str = "job") -> Any:
    base = {f"tests/test_x.py::test_{name}[{i}]": make(name=f"b{i}") for i in range(n)}
    head = {k: make(shift(dataloader=3.0 * i), name=f"h{i}")
            for i, k in enumerate(base)}
    return compare_sets(base, head)


CASES = {
    "comparison": lambda: compare(make(name="main"),
                                  make(shift(dataloader=4.0), name="pr-42")),
    "set": lambda: _set(3),
    "set_over_the_cap": lambda: _set(MAX_JOBS + 4),
    "hostile_names": lambda: compare(make(name=HOSTILE), make(name=HOSTILE)),
    "hostile_keys": lambda: _set(2, name=HOSTILE),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_chart_in_the_markdown_report_renders_in_mermaid(case, page, mermaid_js,
                                                              tmp_path):
    result = CASES[case]()
    (chart,) = _mermaid_blocks(render_markdown(result))
    assert chart == comparison_chart(result)
    _open(page, mermaid_js, tmp_path)
    drawn = _render(page, chart)
    assert drawn["ok"], drawn
    sides = 2 * (1 if case in ("comparison", "hostile_names")
                 else min(len(result.items), MAX_JOBS))
    assert drawn["series"] == len(PHASES)
    assert drawn["bars"] == sides
    assert len(set(drawn["labels"])) == sides, drawn["labels"]
    page.screenshot(path=str(tmp_path / f"{case}.png"))
    assert not page.console_errors and not page.requests_blocked


def test_the_check_fails_on_a_chart_mermaid_rejects(page, mermaid_js, tmp_path):
    # The same chart with a run name put in unsanitised: mermaid's parser rejects it.
    chart = comparison_chart(CASES["comparison"]())
    assert chart is not None
    broken = chart.replace('"base"', '"ba"se"')
    _open(page, mermaid_js, tmp_path)
    drawn = _render(page, broken)
    assert not drawn["ok"] and "Parse error" in drawn["error"]


# --- the HTML report -----------------------------------------------------------------------

_CHARTS = """() => Array.from(document.querySelectorAll('.chart svg')).map(svg => {
  const box = svg.getBoundingClientRect();
  return {width: box.width, height: box.height,
          marks: svg.querySelectorAll('path, rect, use').length,
          texts: svg.querySelectorAll('text').length};
})"""


def _report(tmp_path: Path, *inputs: Any) -> Path:
    import json

    from tests.gate.summaries import DATA
    from traceml_ci.cli.main import main
    from traceml_ci.gate import write_baseline_set

    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    paths = []
    for i, x in enumerate(inputs):
        if isinstance(x, str):
            paths.append(str(DATA / f"{x}.json"))
        elif isinstance(x, dict) and all(isinstance(v, dict) and "run" in v for v in x.values()):
            target = tmp_path / f"set{i}.json"
            write_baseline_set(target, x)
            paths.append(str(target))
        else:
            target = tmp_path / f"in{i}.json"
            target.write_text(json.dumps(x))
            paths.append(str(target))
    out = tmp_path / "report.html"
    assert main(["report", *paths, "-o", str(out)]) == 0
    return out


REPORTS = {
    "one_run": lambda t: _report(t, "input_bound_a"),
    "diff": lambda t: _report(t, make(name="main"), make(shift(dataloader=4.0), name="pr")),
    "set": lambda t: _report(t, {"t::a": make(), "t::b": make()},
                             {"t::a": make(), "t::b": make(shift(other=6.0))}),
    "trend": lambda t: _report(t, "input_bound_a", "input_bound_b", "compute_bound",
                               make(name=HOSTILE)),
}
CHART_COUNT = {"one_run": 3, "diff": 3, "set": 6, "trend": 1 + 4 * 3}


@pytest.mark.parametrize("kind", sorted(REPORTS))
def test_the_html_report_loads_without_errors_and_draws_its_charts(kind, page, tmp_path):
    report = REPORTS[kind](tmp_path)
    page.goto(report.as_uri())
    charts = page.evaluate(_CHARTS)
    assert len(charts) == CHART_COUNT[kind]
    for chart in charts:  # laid out, with marks (bars, lines) and text (axes, legend)
        assert chart["width"] > 200 and chart["height"] > 60, chart
        assert chart["marks"] >= 5 and chart["texts"] >= 3, chart
    page.screenshot(path=str(tmp_path / f"report_{kind}.png"), full_page=True)
    assert not page.console_errors and not page.requests_blocked


def test_the_report_check_catches_a_page_that_fetches(page, tmp_path):
    # Control: the same page with an image from the network is refused by its own policy,
    # and the refusal is a console error the check above would fail on.
    report = REPORTS["one_run"](tmp_path)
    html = report.read_text(encoding="utf-8")
    report.write_text(html.replace("<body>", '<body><img src="https://example.invalid/x.png">'))
    page.goto(report.as_uri())
    page.wait_for_timeout(200)
    assert page.console_errors or page.requests_blocked
