"""The mermaid chart (gate/render/chart.py): golden text, size bound, sanitised labels, stacking.

That mermaid itself renders each chart is checked in tests/browser/test_render_in_chromium.py.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests import golden
from tests.gate.summaries import BASE_MS, GOLDEN, make, real, shift
from traceml_ci.gate import compare, compare_sets, render_markdown, render_text
from traceml_ci.gate.render.chart import (
    MAX_CHART_CHARS,
    MAX_JOBS,
    MAX_LABEL,
    PHASE_COLOURS,
    comparison_chart,
    label,
    legend,
    stacked_chart,
)
from traceml_ci.summary.keys import PHASES, PHASES_WITH_WAIT

HOSTILE = 'x"]\n    bar [1]\n%%{init: {}}%%`;<b>&#1;\u202e[y]'


def _big_set(n: int, name: str = "tests/test_train.py::test_step") -> object:
    base = {f"{name}[{i}-{'x' * 60}]": make(name=f"b{i}") for i in range(n)}
    head = {k: make(shift(other=float(i)), name=f"h{i}") for i, k in enumerate(base)}
    return compare_sets(base, head)


def test_golden_chart_of_a_real_comparison():
    chart = comparison_chart(compare(real("input_bound_a"), real("input_bound_b")))
    golden.check_golden(GOLDEN / "chart_pass.mmd", chart, __file__)


def test_golden_chart_of_a_set():
    chart = comparison_chart(_big_set(2, name="t::job"))
    golden.check_golden(GOLDEN / "chart_set.mmd", chart, __file__)


def test_bars_are_cumulative_so_each_visible_segment_is_its_phase_share():
    head = make(shift(dataloader=4.0), name="head")
    chart = stacked_chart([("head", {"dataloader": 40.0, "forward": 30.0, "backward": 20.0,
                                     "optimizer": 6.0, "other": 4.0})], "t")
    series = [float(x) for x in re.findall(r"bar \[([\d.]+)\]", chart)]
    # Drawn in this order, each over the last: other's end, optimizer's end, ..., dataloader's.
    assert series == [100.0, 96.0, 90.0, 70.0, 40.0]
    assert head is not None


def test_shares_over_100_from_rounding_are_scaled_to_100():
    chart = stacked_chart([("x", {p: 20.5 for p in PHASES})], "t")
    assert "bar [100.0]" in chart and "102.5" not in chart


def test_set_chart_is_capped_and_says_how_many_jobs_it_left_out():
    result = _big_set(MAX_JOBS + 5)
    chart = comparison_chart(result)
    assert chart is not None
    (axis,) = re.findall(r"x-axis \[(.*)\]", chart)
    assert axis.count('", "') + 1 == 2 * MAX_JOBS
    assert "(5 more not shown)" in chart
    assert len(chart) <= MAX_CHART_CHARS


def test_flagged_jobs_are_charted_first():
    base = {f"k{i}": make(name="b") for i in range(MAX_JOBS + 1)}
    head = dict(base, k9=make(shift(dataloader=8.0), name="h"))
    head[f"k{MAX_JOBS}"] = make(shift(dataloader=8.0), name="h")
    chart = comparison_chart(compare_sets(base, head))
    assert chart is not None and f'"k{MAX_JOBS} base"' in chart


@given(st.text(max_size=200))
def test_any_label_is_one_safe_line(text):
    out = label(text)
    assert 1 <= len(out) <= MAX_LABEL
    assert re.fullmatch(r"[A-Za-z0-9 _.,:/+=@()-]+", out), out


def test_hostile_run_names_and_keys_cannot_break_out_of_the_chart():
    for result in (compare(make(name=HOSTILE), make(name=HOSTILE)),
                   compare_sets({HOSTILE: make(name=HOSTILE)}, {HOSTILE: make(name="h")})):
        md = render_markdown(result)
        (chart,) = re.findall(r"```mermaid\n(.*?)```", md, flags=re.S)
        assert chart == comparison_chart(result)
        lines = chart.splitlines()
        assert len(lines) == 5 + len(PHASES)  # no injected line
        assert sum(line.startswith("%%") for line in lines) == 1  # only our own directive
        assert "`" not in chart and "<" not in chart


def test_no_chart_without_a_phase_split():
    doc = make(name="a")
    assert comparison_chart(compare(doc, doc)) is not None
    bare = {k: v for k, v in doc.items() if k != "step_time"}
    assert comparison_chart(compare(bare, bare)) is None
    assert "```mermaid" not in render_markdown(compare(bare, bare))


def test_markdown_carries_the_chart_and_text_keeps_the_plain_bars():
    result = compare(make(name="main"), make(shift(dataloader=4.0), name="pr"))
    assert "```mermaid\n" in render_markdown(result)
    text = render_text(result, width=100)
    assert "mermaid" not in text and "█" in text


def test_no_chart_when_the_comment_has_no_room_left():
    result = _big_set(3)
    assert "```mermaid" in render_markdown(result)
    for max_chars in (2_000, 3_000, 5_000):  # the chart comes only with room for it
        assert len(render_markdown(result, max_chars=max_chars)) <= max_chars
    assert "```mermaid" not in render_markdown(result, max_chars=2_000)


# --- The wait phase (runs with a process group) ---------------------------------------------

WAIT_MS = {**BASE_MS, "wait": 5.0}  # 25 ms a step, 20 % of it waiting for the other ranks


def _series(chart: str) -> list[list[float]]:
    """Each ``bar`` line's values: the cumulative shares, longest first."""
    return [[float(x) for x in line.split("[", 1)[1].rstrip("]").split(", ")]
            for line in chart.splitlines() if line.startswith("    bar [")]


def test_a_run_with_the_wait_phase_is_charted_with_it_and_adds_up_to_100():
    result = compare(make(WAIT_MS, name="a"), make(shift(WAIT_MS, forward=1.0), name="b"))
    chart = comparison_chart(result)
    assert chart is not None
    series = _series(chart)
    assert len(series) == len(PHASES_WITH_WAIT)
    assert all(abs(x - 100.0) <= 0.1 for x in series[0])  # both bars reach 100 %
    # The wait segment (between backward's end and wait's end) is the wait share.
    wait_i = len(PHASES_WITH_WAIT) - 1 - PHASES_WITH_WAIT.index("wait")
    for side, share in zip(series[wait_i], (20.0, 5.0 / 26.0 * 100.0), strict=True):
        assert abs(side - series[wait_i + 1][series[wait_i].index(side)] - share) < 0.1
    md = render_markdown(result)
    assert "🟫 wait" in md and PHASE_COLOURS["wait"] in md
    legend = next(line for line in md.splitlines() if line.startswith("🟦"))
    assert [w for w in legend.split() if w.isalpha()] == list(PHASES_WITH_WAIT)


def test_a_wait_phase_only_one_side_has_is_drawn_on_that_side_alone():
    result = compare(make(name="single"), make(WAIT_MS, name="ddp"))
    row = result.row("step_time.wait_pct")
    assert row is not None and row.base is None and row.head == 20.0  # new in head
    series = _series(comparison_chart(result) or "")
    wait_i = len(PHASES_WITH_WAIT) - 1 - PHASES_WITH_WAIT.index("wait")
    base, head = ([run[i] for run in series] for i in (0, 1))
    # The chart draws each side's own split: both reach 100 %, the base's wait is 0.
    assert abs(base[0] - 100.0) <= 0.1 and abs(head[0] - 100.0) <= 0.1
    assert base[wait_i] == base[wait_i + 1]
    assert abs(head[wait_i] - head[wait_i + 1] - 20.0) < 0.1


def test_without_the_wait_phase_the_legend_and_palette_are_the_five_phases():
    md = render_markdown(compare(make(name="a"), make(name="b")))
    assert "wait" not in md and PHASE_COLOURS["wait"] not in md
    assert legend(PHASES) in md


def test_html_bars_of_runs_with_and_without_the_wait_phase_each_add_up(tmp_path):
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    from traceml_ci.gate.render.html import _Charts
    from traceml_ci.summary.view import SummaryView

    svg = _Charts().splits([("ddp", SummaryView(make(WAIT_MS)).shares()),
                            ("single", SummaryView(make()).shares())])
    assert svg is not None
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    assert texts[-len(PHASES_WITH_WAIT):] == list(PHASES_WITH_WAIT)  # the legend, in order
    # Bar segments: (left, right, y, colour). Both rows end at the same x: 100 % each.
    rects = re.findall(r'<path d="M ([\d.]+) ([\d.]+) \nL ([\d.]+) [\d.]+ \n[^"]*" '
                       r'clip-path="[^"]*" style="fill: (#[0-9a-f]+)"', svg)
    rows: dict[str, list[tuple[float, float, str]]] = {}
    for left, y, right, colour in rects:
        rows.setdefault(y, []).append((float(left), float(right), colour))
    assert len(rows) == 2
    ends = [max(r for _, r, _ in segs) for segs in rows.values()]
    assert abs(ends[0] - ends[1]) < 0.01
    widths = {y: {c: r - left for left, r, c in segs} for y, segs in rows.items()}
    ddp, single = widths.values()
    start = min(left for segs in rows.values() for left, _, _ in segs)
    full = ends[0] - start
    assert abs(ddp[PHASE_COLOURS["wait"]] / full - 0.20) < 0.005
    assert single[PHASE_COLOURS["wait"]] == 0.0
