"""Renderers: markdown golden files, escaping of input, terminal text, JSON.

Golden files live in tests/gate/golden/. After an intended change to the markdown, regenerate
them and review the diff:

    TRACEML_CI_REGEN_GOLDEN=1 .venv/bin/pytest tests/gate/test_render.py
    git diff tests/gate/golden/
"""

from __future__ import annotations

import json
import re

import pytest

from tests import golden
from tests.gate.summaries import GOLDEN, TRACEML_AI, make, real, shift
from traceml_ci.gate import (
    compare,
    compare_sets,
    fmt,
    load_input,
    render_json,
    render_markdown,
    render_text,
)
from traceml_ci.gate.fmt import markdown as md_escape
from traceml_ci.gate.render.comparison import MARKER, split_bar


def check_golden(name: str, text: str) -> None:
    __tracebackhide__ = True
    golden.check_golden(GOLDEN / name, text, __file__)


def _regression():
    base = make(name="main")
    head = make(shift(dataloader=4.0, forward=0.5), rss_mb=340.0, name="pr-42")
    return compare(base, head)


def _set():
    base = {"tests/test_train.py::test_step[small]": make(name="a"),
            "tests/test_train.py::test_step[large]": make(name="b"),
            "tests/test_train.py::test_removed": make(name="c")}
    head = {"tests/test_train.py::test_step[small]": make(name="a"),
            "tests/test_train.py::test_step[large]": make(shift(other=6.0), name="b"),
            "tests/test_train.py::test_new": make(name="d")}
    return compare_sets(base, head)


def _causes():
    """A head that changed what the summaries can name: the DataLoader's workers, the
    optimizer, a scalar read per step (its file name hostile)."""
    import copy

    from tests.gate.test_counters import COUNTERS

    loader = {"num_workers": 2, "pin_memory": False, "persistent_workers": False,
              "prefetch_factor": 2, "batch_size": 16, "device": "cpu"}
    base, head = make(name="main"), make(name="pr-7")
    base["counters"], head["counters"] = copy.deepcopy(COUNTERS), copy.deepcopy(COUNTERS)
    base["step_time"]["dataloader"] = loader
    head["step_time"]["dataloader"] = dict(loader, num_workers=0, prefetch_factor=None)
    head["counters"]["optimizer"] = dict(COUNTERS["optimizer"], classes=["AdamW"],
                                         state_tensors_per_param=2.0, state_bytes=5408)
    head["counters"]["syncs"] = {"per_step": 2, "sites": [
        {"at": "train.py:42", "op": "item", "count": 1},
        {"at": "lib/<b>@ops|x.py:7", "op": "item", "count": 1}]}
    return compare(base, head)


CASES = {
    "causes.md": _causes,
    "pass.md": lambda: compare(real("input_bound_a"), real("input_bound_b")),
    "regression.md": _regression,
    "set.md": _set,
    "traceml_ai.md": lambda: compare(
        *load_input(TRACEML_AI / "compute_bound.json").values(),
        *load_input(TRACEML_AI / "input_bound.json").values(),
    ),
    "env_mismatch.md": lambda: compare(
        make(device_type="cuda", device_name="NVIDIA A100-SXM4-80GB"),
        make(shift(backward=3.0), device_type="cuda", device_name="NVIDIA H100 80GB HBM3"),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_markdown_golden(name):
    check_golden(name, render_markdown(CASES[name]()))


def test_markdown_layout_verdict_first_then_table_bars_and_folded_rows():
    md = render_markdown(_regression())
    lines = md.splitlines()
    assert lines[0] == MARKER
    assert lines[1].startswith("**❌ traceml-ci regression: ")
    changed, folded = md.split("<details>")
    assert "| step_time.dataloader_pct" in changed
    assert "🔴 regressed" in changed
    assert "| step_time.phase_ms.forward" in folded  # unchanged rows live under <details>
    assert "```text\nbase  " in changed and "\nhead  " in changed
    assert folded.count("</details>") == 1


def test_crafted_input_cannot_break_or_inject_into_the_markdown():
    evil = "x|y</details><script>alert(1)</script>`code`\n# heading @team [a](http://e.vil)"
    base, head = make(name=evil), make(shift(dataloader=4.0), name=evil)
    head["run"]["status"] = "crashed"
    s = compare_sets({evil: base}, {evil: head, evil + "2": make()})
    md = render_markdown(s)
    for bad in ("<script>", "</details><", "`code`", "|y", "@team", "[a](", "\n# heading"):
        assert bad not in md
    # every table row still has exactly six (or three) unescaped cell separators
    for line in md.splitlines():
        if line.startswith("|"):
            assert line.count("|") in (4, 7), line
    assert md.count("<details>") == md.count("</details>")


def test_md_escape():
    assert md_escape("a|b") == "a&#124;b"
    assert md_escape("<b>&") == "&lt;b&gt;&amp;"
    assert md_escape("l1\nl2\r\tx") == "l1 l2  x"
    assert md_escape("`x` @me [l] *e*") == "&#96;x&#96; @&#8203;me &#91;l&#93; &#42;e&#42;"
    # Mentions, issue references and bare URLs are linked by GitHub after entities are decoded:
    # a zero-width space breaks each one.
    assert md_escape("org/repo#12 #3") == "org/repo#&#8203;12 #&#8203;3"
    assert md_escape("see https://x.io or www.x.io") == (
        "see https:&#8203;//x.io or www&#8203;.x.io"
    )
    assert md_escape("step_time.dataloader_pct") == "step_time.dataloader_pct"


def test_split_bar_always_fills_the_width():
    for width in (10, 40, 57):
        bar = split_bar({"dataloader": 33.3, "forward": 33.3, "backward": 33.4,
                         "optimizer": 0.0, "other": 0.0}, width)
        assert len(bar) == width
    assert split_bar({"dataloader": 50.0, "forward": 50.0, "backward": 0, "optimizer": 0,
                      "other": 0}, 10) == "█████▓▓▓▓▓"


def test_markdown_of_a_huge_set_stays_under_the_comment_limit():
    base = {f"t::{i}": make() for i in range(400)}
    head = {f"t::{i}": make(shift(dataloader=4.0)) for i in range(400)}
    md = render_markdown(compare_sets(base, head), max_chars=20_000)
    assert len(md) < 20_000
    assert "further details left out" in md


def test_text_is_plain_without_colour_and_fits_the_width():
    text = render_text(_regression(), width=100, colour=False)
    assert "\x1b[" not in text
    assert text.splitlines()[0].startswith("traceml-ci regression: ")
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "step_time.dataloader_pct" in text
    coloured = render_text(_regression(), width=100, colour=True)
    assert "\x1b[" in coloured


def test_text_of_a_set_names_each_key():
    text = render_text(_set(), width=120)
    assert "tests/test_train.py::test_step[large]: regression" in text
    assert "1 added (no baseline yet): tests/test_train.py::test_new" in text


@pytest.mark.parametrize(("x", "per_s", "text"), [
    (0, False, "0 FLOP"),
    (512, False, "512 FLOP"),
    (647_168, False, "647 kFLOP"),
    (999_700, False, "1 MFLOP"),  # rounds up to the next prefix, never "1e+03 kFLOP"
    (1.0e9, False, "1 GFLOP"),
    (1.25e9, False, "1.25 GFLOP"),
    (693_694_464, False, "694 MFLOP"),
    (3.2e12, True, "3.2 TFLOP/s"),
    (1.16e11, True, "116 GFLOP/s"),
    (2.5e22, False, "25,000 EFLOP"),
])
def test_flops_take_the_si_prefix_that_fits(x, per_s, text):
    assert fmt.flops(x, per_s=per_s) == text


def test_the_gate_shows_flop_rows_with_si_prefixes():
    """A 647,168-FLOP step: the diff's rows read kFLOP and MFLOP/s, and so does its context."""
    def counted(doc, flops, tflops):
        doc["efficiency"] = {"flops_per_step": flops, "achieved_tflops": tflops}
        return doc

    cmp = compare(counted(make(), 647_168.0, 1.2e-4), counted(make(), 810_000.0, 1.5e-4))
    md = render_markdown(cmp)
    row = next(x for x in md.splitlines() if "efficiency.flops_per_step" in x)
    assert "| 647 kFLOP " in row and "| 810 kFLOP " in row
    row = next(x for x in md.splitlines() if "efficiency.achieved_tflops" in x)
    assert "| 120 MFLOP/s " in row and "| 150 MFLOP/s " in row
    # The text report folds unchanged rows to their change; its context line says it.
    text = render_text(cmp, width=160, colour=False)
    for out in (text, md):
        assert "FLOPs per step changed 647 kFLOP → 810 kFLOP (+25.2 %)" in out


def test_json_is_the_comparison():
    doc = json.loads(render_json(_regression()))
    assert doc["kind"] == "comparison" and doc["verdict"] == "regression"
    assert doc["base_run"] == "main" and doc["head_run"] == "pr-42"
    s = json.loads(render_json(_set()))
    assert s["kind"] == "set"
    assert s["added"] == ["tests/test_train.py::test_new"]
    assert s["items"]["tests/test_train.py::test_step[large]"]["verdict"] == "regression"


def test_golden_files_have_the_marker_and_no_trailing_spaces():
    for path in GOLDEN.glob("*.md"):
        text = path.read_text(encoding="utf-8")
        assert text.startswith(MARKER + "\n")
        assert not re.search(r"[ \t]+$", text, re.M), path.name
