"""The mermaid chart (gate/chart.py): golden text, size bound, sanitised labels, stacking.

That mermaid itself renders each chart is checked in tests/browser/test_render_in_chromium.py.
"""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from tests import golden
from tests.gate.summaries import GOLDEN, make, real, shift
from traceml_ci.gate import compare, compare_sets, render_markdown, render_text
from traceml_ci.gate.chart import (
    MAX_CHART_CHARS,
    MAX_JOBS,
    MAX_LABEL,
    comparison_chart,
    label,
    stacked_chart,
)
from traceml_ci.summary.keys import PHASES

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
