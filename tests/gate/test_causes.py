"""The causes a comparison names in its headline (gate/causes.py), from real traced torch loops
that differ in one thing each: the DataLoader's workers, the optimizer, a layer's width, a
scalar read per step. Each renderer names them right under the verdict, before any table, and
escapes what came from the summaries (a module's name, a file's path)."""

from __future__ import annotations

import html

from tests.gate.traced import HOSTILE_FILE, HOSTILE_MODULE, item_site
from traceml_ci.gate import fmt
from traceml_ci.gate.causes import dataloader_change, known_causes
from traceml_ci.gate.compare import Comparison, Status, Verdict, compare
from traceml_ci.gate.render.comparison import render_json, render_markdown, render_text
from traceml_ci.gate.render.html import Run, build_html
from traceml_ci.gate.sets import compare_sets


def _before_tables(text: str, wanted: str) -> None:
    """``wanted`` is in ``text`` before the first table (markdown ``|``, rich's ``━``)."""
    at = text.find(wanted)
    assert at >= 0, text
    tables = [i for i in (text.find("\n|"), text.find("━")) if i >= 0]
    assert not tables or at < min(tables), text


def test_same_code_names_no_cause(traced) -> None:
    c = compare(traced["base"], traced["base"])
    assert c.causes == []
    assert "cause" not in render_markdown(c).lower().split("<details>")[0]


def test_a_dataloader_with_no_workers_is_named_first(traced) -> None:
    assert traced["base"]["step_time"]["dataloader"]["num_workers"] == 2  # the loop's own
    c = compare(traced["base"], traced["workers0"])
    assert c.causes == ["DataLoader num_workers 2 → 0"]
    assert c.to_dict()["causes"] == ["DataLoader num_workers 2 → 0"]
    md = render_markdown(c).splitlines()
    # marker, the verdict, a blank line, then the cause -- whatever the timing made the verdict
    assert md[3].endswith(": DataLoader num_workers 2 → 0") or md[3].endswith(
        ":** DataLoader num_workers 2 → 0"
    )
    text = render_text(c, width=100).splitlines()
    assert text[1].endswith(": DataLoader num_workers 2 → 0")
    assert known_causes(traced["workers0"], traced["base"], []) == ["DataLoader num_workers 0 → 2"]


def test_sgd_to_adamw_is_the_cause_of_a_regression(traced) -> None:
    c = compare(traced["base"], traced["adamw"])
    assert c.verdict is Verdict.REGRESSION
    said = "optimizer SGD → AdamW (+2 state tensors per parameter)"
    assert c.causes == [said]  # the note's "accepted by updating the baseline" is not a cause
    assert c.row("counters.optimizer").note.startswith(said + ";")
    md = render_markdown(c)
    assert md.splitlines()[3] == f"**Cause:** {said}"
    _before_tables(md, said)
    text = render_text(c, width=100)
    assert text.splitlines()[1] == f"cause: {said}"
    _before_tables(text, said)


def test_a_doubled_width_names_flops_and_the_module_then_the_parameters(traced) -> None:
    c = compare(traced["base"], traced["wide"])
    assert c.verdict is Verdict.REGRESSION
    flops_row = c.row("counters.flops_per_step")
    assert flops_row is not None and flops_row.status is Status.REGRESSED
    # 16→32→4 becomes 16→64→4: both layers' FLOPs double, the first one's by 4× the second's,
    # so the first is named first; the ReLU's count (if any) moves too little to be named.
    base_flops, wide_flops = (
        {m["module"]: m["flops"] for m in traced[run]["counters"]["flops"]["top_modules"]}
        for run in ("base", "wide")
    )
    assert wide_flops["fc1"] == 2 * base_flops["fc1"] and wide_flops["fc2"] == 2 * base_flops["fc2"]
    total = 100.0 * (traced["wide"]["counters"]["flops"]["per_step"]
                     / traced["base"]["counters"]["flops"]["per_step"] - 1)
    moved = [f"fc1 Linear +{fmt.flops(base_flops['fc1'])}",
             f"fc2 Linear +{fmt.flops(base_flops['fc2'])}"]
    flops_cause = f"FLOPs per step {total:+.0f} % ({', '.join(moved)})"
    params_b = traced["base"]["counters"]["params"]["elements"]
    params_h = traced["wide"]["counters"]["params"]["elements"]
    assert c.causes == [flops_cause, f"parameters {params_b:,} → {params_h:,}"]
    md = render_markdown(c).splitlines()
    assert md[3:7] == ["**Causes:**", "", f"- {fmt.markdown(flops_cause)}",
                       f"- parameters {params_b:,} → {params_h:,}"]
    text = render_text(c, width=200).splitlines()
    assert text[1] == f"cause: {flops_cause}"


def test_an_added_item_per_step_names_its_line_in_every_medium(traced) -> None:
    c = compare(traced["base"], traced["item"])
    assert c.verdict is Verdict.REGRESSION
    said = item_site()
    assert c.causes == [said]
    assert render_markdown(c).splitlines()[3] == f"**Cause:** {fmt.markdown(said)}"
    # the pytest plugin's failure text: reason lines whole, however narrow the table
    text = render_text(c, width=60, wrap_reasons=False)
    assert f"cause: {said}" in text.splitlines()
    _before_tables(text, said)
    # the other way round it is no cause of a regression: it passes, naming what changed
    back = compare(traced["item"], traced["base"])
    assert back.row("counters.syncs_per_step").status is Status.IMPROVED
    assert back.causes == [item_site("removes")]


def test_a_set_names_each_flagged_keys_causes_in_its_row_and_section(traced) -> None:
    c = compare_sets(
        {"test_item": traced["base"], "test_same": traced["base"]},
        {"test_item": traced["item"], "test_same": traced["base"]},
    )
    md = render_markdown(c)
    said = fmt.markdown(item_site())
    rows = [line for line in md.splitlines() if line.startswith("| test_item")]
    assert len(rows) == 1 and said in rows[0]
    assert "| key" in md and "| cause" in md.split("<details>")[0]
    section = md.split("#### ❌ test_item", 1)[1].splitlines()
    assert section[2] == f"**Cause:** {said}"
    # the passed key's row stays short: no causes column in its folded table
    passed = md.split("<summary>1 passed</summary>", 1)[1].split("</details>", 1)[0]
    assert "cause" not in passed
    text = render_text(c, width=120)
    lines = text.splitlines()
    at = lines.index("test_item: regression")
    assert lines[at + 1] == f"cause: {item_site()}"


def test_hostile_module_and_file_names_are_escaped_in_every_medium(traced) -> None:
    c = compare(traced["hostile_base"], traced["hostile_head"])
    assert c.verdict is Verdict.REGRESSION
    flops_cause, syncs_cause = c.causes[0], c.causes[1]
    assert flops_cause.startswith("FLOPs per step") and HOSTILE_MODULE + " Linear +" in flops_cause
    assert syncs_cause.startswith("adds 1 scalar read per step at ") and HOSTILE_FILE in syncs_cause

    md = render_markdown(c)
    assert f"- {fmt.markdown(flops_cause)}" in md.splitlines()
    assert f"- {fmt.markdown(syncs_cause)}" in md.splitlines()
    for raw in ("<b>", "<i>", "@team", "\x1b", "`[y](z)"):
        assert raw not in md, raw
    assert "@&#8203;team" in md and "&lt;b&gt;" in md and "x&#124;" in md

    text = render_text(c, width=300, colour=False)
    assert "\x1b" not in text
    assert f"cause: {fmt.plain(syncs_cause)}" in text.splitlines()

    page = build_html([Run("head", "h.json", traced["hostile_head"])],
                      base=[Run("base", "b.json", traced["hostile_base"])], comparison=c)
    assert "x|<b>" not in page and "evil|<i>" not in page and "\x1b" not in page
    assert f"<li>{html.escape(fmt.plain(syncs_cause))}</li>" in page

    assert render_json(c).count("\\u001b") >= 1  # JSON escapes it itself


def test_an_incomparable_comparison_names_no_cause(traced) -> None:
    head = dict(traced["item"], step_time=dict(traced["item"]["step_time"], steps_analyzed=0))
    c = compare(traced["base"], head)
    assert isinstance(c, Comparison) and c.verdict is Verdict.INCOMPARABLE
    assert c.causes == []


def test_a_dataloader_on_one_side_only_is_named_and_an_older_summary_names_nothing(traced) -> None:
    base = traced["base"]
    none = dict(base, step_time=dict(base["step_time"], dataloader=None))  # manual mode's null
    assert dataloader_change(base, none) == "DataLoader in base only (head recorded none)"
    assert dataloader_change(none, base) == "DataLoader in head only (base recorded none)"
    older = dict(base, step_time={k: v for k, v in base["step_time"].items() if k != "dataloader"})
    assert dataloader_change(base, older) == "" and dataloader_change(older, none) == ""
    # with workers on both sides their own settings count; without, torch sets them itself
    more = dict(base, step_time=dict(base["step_time"], dataloader=dict(
        base["step_time"]["dataloader"], num_workers=4, prefetch_factor=8, pin_memory=True)))
    assert dataloader_change(base, more) == (
        "DataLoader num_workers 2 → 4, pin_memory False → True, prefetch_factor 2 → 8"
    )


def test_the_pytest_plugins_row_for_a_test_names_the_cause(traced) -> None:
    from pytest_plugin.gating import _first_reason

    assert _first_reason(compare(traced["base"], traced["item"])) == f"cause: {item_site()}"
    # no cause known: the reason naming the first regressed row, as before
    same = compare(traced["base"], traced["base"])
    assert same.causes == [] and not _first_reason(same).startswith("cause:")
