"""compare(): statuses, tiers, the noise rule, labels, shares, environments, sets."""

from __future__ import annotations

import copy

import pytest

from tests.gate.summaries import BASE_MS, make, real, shift
from traceml_ci.gate import DEFAULT_RULES, Status, Verdict, compare, compare_sets
from traceml_ci.gate.compare import env_differences


def rules(**tolerances):
    return DEFAULT_RULES.with_tolerances(tolerances)


def test_identical_real_summaries_pass_with_every_row_ok():
    doc = real()
    c = compare(doc, copy.deepcopy(doc))
    assert c.verdict is Verdict.PASS
    assert {r.status for r in c.rows} == {Status.OK}
    assert c.reasons == []
    names = [r.name for r in c.rows]
    assert names[:6] == ["step_time.diagnosis", "step_time.dataloader_pct",
                         "step_time.forward_pct", "step_time.backward_pct",
                         "step_time.optimizer_pct", "step_time.other_pct"]
    # null on both sides (CPU run: no allocator figures) gives no row at all
    assert "step_memory.peak_allocated_mb" not in names


def test_two_runs_of_the_same_example_pass():
    assert compare(real("input_bound_a"), real("input_bound_b")).verdict is Verdict.PASS


def test_slower_dataloader_is_a_regression_on_its_share_with_the_delta_in_pp():
    base, head = make(), make(shift(dataloader=4.0))  # 20% -> 33.3% of the step
    c = compare(base, head)
    row = c.row("step_time.dataloader_pct")
    assert row.status is Status.REGRESSED
    assert row.delta == pytest.approx(33.33 - 20.0, abs=0.02)
    assert row.delta_unit == "pp"
    assert c.verdict is Verdict.REGRESSION
    assert any(r.startswith("step_time.dataloader_pct: 20.0% → 33.3%") for r in c.reasons)
    # its neighbours' shares fell only because the dataloader grew: not "improved"
    fwd = c.row("step_time.forward_pct")
    assert fwd.status is Status.OK and "other phases grew" in fwd.note


def test_a_shift_between_the_warn_and_fail_tiers_warns():
    head = make(shift(dataloader=0.9))  # +3.6 pp: past warn (3), short of fail (5)
    c = compare(make(), head)
    assert c.row("step_time.dataloader_pct").status is Status.WARN
    assert c.verdict is Verdict.WARN


def test_noise_turns_a_regression_beyond_tolerance_into_a_warning():
    base = make(iqr_pp=6.0)
    head = make(shift(dataloader=2.0), iqr_pp=6.0)  # +8.3 pp, noise 1 x hypot(6, 6) = 8.5 pp
    c = compare(base, head)
    row = c.row("step_time.dataloader_pct")
    assert row.status is Status.WARN
    assert row.noise == pytest.approx(8.485, abs=0.01)
    assert "within noise" in row.note
    assert c.verdict is Verdict.WARN
    # the same shift on quiet runs is a regression
    assert compare(make(), make(shift(dataloader=2.0))).verdict is Verdict.REGRESSION


def test_noise_factor_zero_turns_the_noise_rule_off():
    base, head = make(iqr_pp=6.0), make(shift(dataloader=2.0), iqr_pp=6.0)
    strict = DEFAULT_RULES.with_tolerances({}, noise_factor=0.0)
    assert compare(base, head, strict).verdict is Verdict.REGRESSION


def test_without_noise_blocks_tolerances_decide_and_the_report_says_so():
    c = compare(make(iqr_pp=None), make(shift(dataloader=2.0), iqr_pp=None))
    assert c.row("step_time.dataloader_pct").noise is None
    assert c.verdict is Verdict.REGRESSION
    assert any("no noise estimate in base and head" in r for r in c.reasons)


def test_slower_step_time_on_a_device_clock_regresses_relative_to_base():
    gpu = {"device_type": "cuda", "device_name": "A100"}
    base = make(**gpu)
    head = make({p: v * 1.4 for p, v in BASE_MS.items()}, **gpu)  # +40%, same split
    c = compare(base, head)
    row = c.row("step_time.step_ms.median")
    assert row.status is Status.REGRESSED
    assert row.delta == pytest.approx(40.0)
    assert row.delta_unit == "%"
    assert c.verdict is Verdict.REGRESSION
    # a faster step is an improvement, not a regression
    c = compare(head, base)
    assert c.row("step_time.step_ms.median").status is Status.IMPROVED
    assert c.verdict is Verdict.PASS


def test_margin_noise_rule_needs_the_change_less_the_noise_past_the_tolerance():
    base = make(iqr_pp=2.0)
    head = make(shift(dataloader=3.0), iqr_pp=2.0)  # +10.4 pp, noise hypot(2, 2) = 2.8 pp
    assert compare(base, head).row("step_time.dataloader_pct").status is Status.REGRESSED
    margin = DEFAULT_RULES.with_tolerances({}, noise_rule="margin")
    assert compare(base, head, margin).row("step_time.dataloader_pct").status is Status.REGRESSED
    head = make(shift(dataloader=1.6), iqr_pp=2.0)  # +5.9 pp: past 5 and 2.8, but 5.9 - 2.8 < 5
    assert compare(base, head).row("step_time.dataloader_pct").status is Status.REGRESSED
    row = compare(base, head, margin).row("step_time.dataloader_pct")
    assert row.status is Status.WARN and "within noise" in row.note


def test_memory_needs_both_the_relative_and_the_absolute_threshold():
    assert compare(make(rss_mb=300), make(rss_mb=340)).verdict is Verdict.REGRESSION  # +13%, 40 MB
    small = compare(make(rss_mb=100), make(rss_mb=115))  # +15% but only 15 MB
    assert small.row("step_memory.peak_rss_mb").status is Status.WARN  # past warn: 5% & 8 MB
    # on a host clock no warn tier: unchanged runs moved +5 % and 8 MB on a loaded runner
    host = compare(make(rss_mb=100, clock="host"), make(rss_mb=115, clock="host"))
    assert host.row("step_memory.peak_rss_mb").status is Status.OK
    assert host.verdict is Verdict.PASS
    assert compare(make(rss_mb=300), make(rss_mb=310)).verdict is Verdict.PASS


def test_worse_step_time_label_is_a_regression_and_better_one_an_improvement():
    compute = make()  # COMPUTE_BOUND
    input_bound = make(shift(dataloader=12.0))  # dataloader 50%
    c = compare(compute, input_bound)
    assert c.row("step_time.diagnosis").status is Status.REGRESSED
    assert c.row("step_time.diagnosis").note == "diagnosis changed"
    back = compare(input_bound, compute)
    assert back.row("step_time.diagnosis").status is Status.IMPROVED


def test_a_label_that_flips_on_a_threshold_while_shares_stay_put_only_warns():
    base = make(diagnosis="BALANCED")
    head = make(diagnosis="INPUT_BOUND")  # same split: the run sits on a threshold
    c = compare(base, head)
    row = c.row("step_time.diagnosis")
    assert row.status is Status.WARN
    assert "threshold" in row.note
    assert c.verdict is Verdict.WARN


def test_label_to_or_from_insufficient_data_is_said_never_a_warning():
    for base, head in ((make(), make(diagnosis="INSUFFICIENT_DATA")),
                       (make(diagnosis="INSUFFICIENT_DATA"), make())):
        c = compare(base, head)
        row = c.row("step_time.diagnosis")
        assert row.status is Status.OK
        assert row.note == "too little data on one side to judge the label"
        assert c.verdict is Verdict.PASS


def test_memory_label_change_is_a_regression():
    head = make()
    head["step_memory"]["diagnosis"] = "MEMORY_GROWTH"
    c = compare(make(), head)
    assert c.row("step_memory.diagnosis").status is Status.REGRESSED
    assert c.verdict is Verdict.REGRESSION


def test_share_that_rose_only_because_other_phases_got_faster_warns():
    base = make(shift(dataloader=10.0))  # 30 ms step, dataloader 14 ms
    head = make()  # 20 ms: the dataloader got faster; forward's share rose 20% -> 30%
    c = compare(base, head)
    fwd = c.row("step_time.forward_pct")
    assert fwd.delta > 5
    assert fwd.status is Status.WARN
    assert "other phases got faster" in fwd.note
    assert c.row("step_time.dataloader_pct").status is Status.IMPROVED
    assert c.verdict is Verdict.WARN


def test_direction_any_fails_a_change_either_way():
    base, head = make(shift(dataloader=4.0)), make()  # dataloader share falls 13 pp
    assert compare(base, head).row("step_time.dataloader_pct").status is Status.IMPROVED
    strict = rules(**{"step_time.dataloader_pct": {"direction": "any"}})
    assert compare(base, head, strict).row("step_time.dataloader_pct").status is Status.REGRESSED


def test_glob_override_and_later_patterns_win():
    r = rules(**{"step_time.*_pct": {"abs": 2.0, "warn_abs": 1.0},
                 "step_time.other_pct": {"abs": 9.0}})
    assert r.rule_for("step_time.forward_pct").abs == 2.0
    assert r.rule_for("step_time.other_pct").abs == 9.0
    assert r.rule_for("step_time.other_pct").warn_abs == 1.0  # the field it did not set stays
    head = make(shift(dataloader=0.6))  # +2.4 pp
    assert compare(make(), head).verdict is Verdict.PASS
    assert compare(make(), head, r).verdict is Verdict.REGRESSION


def test_fail_false_downgrades_to_warn_and_skip_drops_the_row():
    head = make(shift(dataloader=4.0))
    soft = rules(**{"step_time.*": {"fail": False}})
    c = compare(make(), head, soft)
    assert c.row("step_time.dataloader_pct").status is Status.WARN
    assert c.verdict is Verdict.WARN
    gone = rules(**{"step_time.dataloader_pct": {"skip": True}})
    assert compare(make(), head, gone).row("step_time.dataloader_pct") is None


def test_env_mismatch_skips_absolute_times_and_memory_but_keeps_shares():
    base = make(device_type="cuda", device_name="NVIDIA A100")
    head = make({p: v * 3 for p, v in BASE_MS.items()}, rss_mb=900,
                device_type="cuda", device_name="NVIDIA H100")
    c = compare(base, head)
    names = {r.name for r in c.rows}
    assert "step_time.step_ms.median" not in names
    assert "step_memory.peak_rss_mb" not in names
    assert "step_time.step_ms.median" in c.skipped
    assert "step_time.dataloader_pct" in names
    assert c.verdict is Verdict.PASS
    assert any("NVIDIA A100 → NVIDIA H100" in r for r in c.reasons)
    anyway = compare(base, head, allow_env_mismatch=True)
    assert anyway.verdict is Verdict.REGRESSION
    assert any("compared anyway" in r for r in anyway.reasons)


def test_env_differences_cover_device_type_gpu_model_and_torch_major():
    cpu, gpu = make(), make(device_type="cuda", device_name="A100")
    assert env_differences(cpu, gpu) == ["device type cpu → cuda"]
    assert env_differences(make(torch="2.4.0"), make(torch="3.0.1")) == [
        "torch major version 2 → 3"
    ]
    assert env_differences(make(torch="2.4.0"), make(torch="2.6.0+cpu")) == []
    # CPU model names are not compared (shared CI runners vary), unknown is not a difference
    assert env_differences(make(device_name="x86_64"), make(device_name="arm64")) == []
    assert env_differences(make(torch=None), make(torch="3.0")) == []


def test_nothing_comparable_is_incomparable():
    base, head = make(), make()
    for doc in (base, head):
        for p in ("dataloader", "forward", "backward", "optimizer", "other"):
            doc["step_time"][f"{p}_pct"] = None
    only_env = rules(**{"step_*.diagnosis": {"skip": True}})
    head["env"]["device_type"] = "cuda"
    c = compare(base, head, only_env)
    assert c.verdict is Verdict.INCOMPARABLE
    assert any("nothing left to compare" in r for r in c.reasons)


def test_value_only_in_head_is_new_and_only_in_base_is_missing():
    base, head = make(), make()
    head["step_memory"]["peak_allocated_mb"] = 120.0
    base["step_memory"]["peak_reserved_mb"] = 200.0
    c = compare(base, head)
    assert c.row("step_memory.peak_allocated_mb").status is Status.NEW
    assert c.row("step_memory.peak_reserved_mb").status is Status.MISSING
    assert c.verdict is Verdict.WARN


def test_a_crashed_head_run_warns():
    head = make()
    head["run"]["status"] = "crashed"
    c = compare(make(), head)
    assert c.verdict is Verdict.WARN
    assert any("head run crashed" in r for r in c.reasons)


def test_relative_delta_from_a_zero_base_is_undefined_but_judged():
    base, head = make(rss_mb=0.0), make(rss_mb=50.0)
    row = compare(base, head).row("step_memory.peak_rss_mb")
    assert row.delta is None
    assert row.status is Status.REGRESSED


def test_sets_match_keys_and_report_added_and_removed():
    base = {"t::a": make(), "t::b": make(), "t::gone": make()}
    head = {"t::a": make(), "t::b": make(shift(dataloader=4.0)), "t::new": make()}
    s = compare_sets(base, head)
    assert list(s.items) == ["t::a", "t::b"]
    assert s.added == ["t::new"] and s.removed == ["t::gone"]
    assert s.items["t::a"].verdict is Verdict.PASS
    assert s.items["t::b"].verdict is Verdict.REGRESSION
    assert s.verdict is Verdict.REGRESSION
    assert "1 of 2 regressed: t::b" in s.reasons


def test_set_verdicts_without_regressions():
    same = {"a": make()}
    assert compare_sets(same, {"a": make()}).verdict is Verdict.PASS
    assert compare_sets(same, {"a": make(), "b": make()}).verdict is Verdict.PASS  # added: fine
    assert compare_sets({"a": make(), "b": make()}, same).verdict is Verdict.WARN  # removed
    disjoint = compare_sets(same, {"b": make()})
    assert disjoint.verdict is Verdict.INCOMPARABLE
    assert "no key in common" in disjoint.reasons


def test_comparison_to_dict_is_plain_json():
    import json

    c = compare(make(), make(shift(dataloader=4.0)))
    doc = json.loads(json.dumps(c.to_dict(), allow_nan=False))
    assert doc["verdict"] == "regression"
    row = next(r for r in doc["rows"] if r["name"] == "step_time.dataloader_pct")
    assert row["status"] == "regressed"
    assert row["tolerance"]["abs"] == 5.0 and row["tolerance"]["text"] == "+5 pp (warn +3 pp)"


def test_load_guard_a_slower_median_with_steady_fastest_steps_only_warns():
    gpu = {"device_type": "cuda", "device_name": "A100"}
    base = make(**gpu)
    head = make({p: v * 1.4 for p, v in BASE_MS.items()}, **gpu)  # median +40%
    head["step_time"]["step_ms"]["p10"] = base["step_time"]["step_ms"]["p10"] * 1.05
    c = compare(base, head)
    row = c.row("step_time.step_ms.median")
    assert row.status is Status.WARN
    assert "fastest steps (p10) moved only +5%" in row.note
    # when the fastest steps slow down too, it is a regression (see the uniform slowdown test)
    head["step_time"]["step_ms"]["p10"] = base["step_time"]["step_ms"]["p10"] * 1.3
    assert compare(base, head).row("step_time.step_ms.median").status is Status.REGRESSED
