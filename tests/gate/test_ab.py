"""The A/B decision (gate/ab/sequential.py) on synthetic rounds: a clear slowdown is caught in
few rounds,
identical sides pass, alternating noise stays inconclusive at the cap -- never a pass and never a
regression -- and the rounds run in ABBA order."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.gate.summaries import BASE_MS, make, shift
from tests.gate.traced import item_site
from traceml_ci.errors import ExitCode, InputError, UsageError
from traceml_ci.gate import fmt
from traceml_ci.gate.ab import report as ab_report
from traceml_ci.gate.ab.intervals import CPU_METRIC, Status, quantile_for
from traceml_ci.gate.ab.sequential import (
    DEFAULT_MAX_ROUNDS,
    AbSettings,
    RoundPair,
    Side,
    SideFigures,
    decide,
    round_order,
    run_rounds,
)
from traceml_ci.gate.ab.tdist import t_cdf, t_quantile
from traceml_ci.gate.results import Verdict
from traceml_ci.summary.keys import PHASES, PHASES_WITH_WAIT

SHARES = {"dataloader": 10.0, "forward": 40.0, "backward": 35.0, "optimizer": 10.0, "other": 5.0}


def _fig(step_ms: float, **moved: float) -> SideFigures:
    return SideFigures(step_ms, {**SHARES, **moved})


def _rounds(pairs: list[tuple[SideFigures, SideFigures]]) -> list[RoundPair]:
    return [RoundPair(i + 1, base=b, head=h) for i, (b, h) in enumerate(pairs)]


def _measuring(base_ms, head_ms, calls: list | None = None, **head_moved):
    """A measure function: base_ms(n) / head_ms(n) give each round's median step time."""

    def measure(side: Side, n: int) -> SideFigures:
        if calls is not None:
            calls.append((n, side))
        if side is Side.BASE:
            return _fig(base_ms(n))
        return _fig(head_ms(n), **head_moved)

    return measure


def test_rounds_alternate_abba_and_the_measure_is_called_in_that_order() -> None:
    assert [round_order(n) for n in (1, 2, 3, 4)] == [
        (Side.BASE, Side.HEAD), (Side.HEAD, Side.BASE),
        (Side.BASE, Side.HEAD), (Side.HEAD, Side.BASE),
    ]  # fmt: skip
    calls: list = []
    noisy = [10.0, 13.0, 9.0, 12.0, 10.0, 13.0]  # never decided: runs to the cap
    run_rounds(_measuring(lambda n: 10.0, lambda n: noisy[n - 1], calls), AbSettings(max_rounds=4))
    assert calls == [
        (1, Side.BASE),
        (1, Side.HEAD),
        (2, Side.HEAD),
        (2, Side.BASE),
        (3, Side.BASE),
        (3, Side.HEAD),
        (4, Side.HEAD),
        (4, Side.BASE),
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-0.02, 0.02), min_size=12, max_size=12), st.floats(5.0, 500.0))
def test_a_clear_20pct_slowdown_regresses_within_5_rounds(noise, base_ms) -> None:
    # each run's step time off by up to ±2 %, as identical runs on a quiet machine are; a
    # regression needs 3 rounds, and the worst such noise (alternating extremes) 5
    result = run_rounds(
        _measuring(
            lambda n: base_ms * (1 + noise[2 * n - 2]),
            lambda n: 1.2 * base_ms * (1 + noise[2 * n - 1]),
        )
    )
    assert result.verdict is Verdict.REGRESSION
    assert 3 <= len(result.rounds) <= 5
    assert [iv.label for iv in result.regressed] == ["step time"]
    assert result.reason().startswith(f"regression after {len(result.rounds)} rounds: step time")
    step = result.step
    assert step is not None and step.low > 5.0
    assert step.low <= 20.0 * 1.0 + 5 and step.high >= 20.0 - 5  # the truth is inside


def test_identical_sides_pass_at_the_minimum() -> None:
    result = run_rounds(_measuring(lambda n: 25.0, lambda n: 25.0))
    assert (result.verdict, len(result.rounds)) == (Verdict.PASS, 2)
    assert {iv.status for iv in result.intervals} == {Status.CLEARED}
    assert [iv.metric for iv in result.intervals] == ["step_time", *SHARES]


def test_alternating_15pct_noise_is_inconclusive_at_the_cap_never_pass_or_regression() -> None:
    # the head is 15 % slower in odd rounds and 15 % faster in even ones: no consistent change
    result = run_rounds(_measuring(lambda n: 10.0, lambda n: 10.0 * (1.15 if n % 2 else 0.85)))
    assert result.verdict is Verdict.INCONCLUSIVE
    assert len(result.rounds) == DEFAULT_MAX_ROUNDS
    reason = result.reason()
    assert reason.startswith(f"inconclusive after {DEFAULT_MAX_ROUNDS} rounds: step time ")
    assert reason.endswith("too noisy to decide; re-run")
    assert "forward" not in reason  # the shares did not move: only the noisy metric is named


def test_the_cap_is_honoured_and_undecided_rounds_carry_no_verdict() -> None:
    pairs = [(_fig(10.0), _fig(11.5)), (_fig(10.0), _fig(8.5))]
    assert decide(_rounds(pairs[:1])).verdict is None  # one round: no spread to judge by
    assert decide(_rounds(pairs)).verdict is None  # two, below the cap: another round
    capped = decide(_rounds(pairs), AbSettings(max_rounds=2))
    assert capped.verdict is Verdict.INCONCLUSIVE


def test_a_share_that_grows_regresses_named_even_when_step_time_holds() -> None:
    result = run_rounds(
        _measuring(lambda n: 10.0, lambda n: 10.0 + 0.01 * n, forward=46.0, backward=29.0)
    )
    assert result.verdict is Verdict.REGRESSION
    assert [iv.metric for iv in result.regressed] == ["forward"]
    assert "forward share +6.0 pp" in result.reason()


def test_a_clearly_faster_head_passes() -> None:
    # the gate is one-sided: the evidence only has to rule out a regression past the tolerance
    result = run_rounds(_measuring(lambda n: 10.0, lambda n: 8.0 * (1 + 0.001 * n)))
    assert result.verdict is Verdict.PASS
    assert result.step is not None and result.step.high < -15.0


def test_a_phase_one_side_lacks_counts_as_zero_there() -> None:
    base = SideFigures(10.0, {**SHARES, "dataloader": None, "other": 15.0})
    head = SideFigures(10.0, {**SHARES, "other": 5.0})
    pair = RoundPair(1, base=base, head=head)
    assert pair.share_delta_pp("dataloader") == 10.0
    both_none = RoundPair(1, base=base, head=SideFigures(10.0, {"dataloader": None}))
    assert both_none.share_delta_pp("dataloader") is None
    result = decide(_rounds([(base, head)] * 3))
    assert [iv.metric for iv in result.regressed] == ["dataloader"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0.5, 1.05), st.floats(-2.0, 2.0)), min_size=2, max_size=8))
def test_rounds_all_within_tolerance_never_regress(rounds) -> None:
    # every round's own ratio <= 1.05 and its forward and backward changes within ±2 pp: no
    # interval can put its lower bound past the tolerance (the mean is at most the largest round)
    pairs = [(_fig(10.0), _fig(10.0 * r, forward=40.0 + d, backward=35.0 - d)) for r, d in rounds]
    result = decide(_rounds(pairs), AbSettings(max_rounds=8))
    assert result.verdict is not Verdict.REGRESSION
    if len(rounds) < 8:
        assert result.verdict in (None, Verdict.PASS)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.3, 3.0), min_size=2, max_size=6))
def test_intervals_hold_their_estimate_and_agree_with_the_t_table(ratios) -> None:
    result = decide(_rounds([(_fig(10.0), _fig(10.0 * r)) for r in ratios]))
    step = result.step
    assert step is not None and step.low <= step.estimate <= step.high
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / (len(logs) - 1))
    # the quantile of one of the 1 + 5 metrics judged together (family-wise 95 %)
    half = quantile_for(6, len(logs)) * sd / math.sqrt(len(logs))
    assert step.low == pytest.approx(math.expm1(mean - half) * 100, rel=1e-9, abs=1e-9)
    assert step.high == pytest.approx(math.expm1(mean + half) * 100, rel=1e-9, abs=1e-9)


def test_settings_and_inputs_that_cannot_work_are_refused() -> None:
    with pytest.raises(UsageError, match="rounds"):
        AbSettings(min_rounds=4, max_rounds=3)
    with pytest.raises(UsageError, match="rounds"):
        AbSettings(min_rounds=1)
    with pytest.raises(InputError, match="r.json: the run measured no step time"):
        SideFigures.from_summary({"step_time": {}}, "r.json")
    assert int(ExitCode.INCONCLUSIVE) == 7


def test_the_reports_show_rounds_intervals_and_verdict_escaped() -> None:
    rng = random.Random(3)
    pairs = [
        (_fig(10.0 * (1 + rng.uniform(-0.01, 0.01))), _fig(12.0, forward=45.0, backward=30.0))
        for _ in range(3)
    ]
    result = decide(_rounds(pairs))
    ref = "main\x1b[2J@team #1"
    text = ab_report.render_text(result, ref)
    assert "\x1b" not in text and "main\\x1b[2J" in text
    assert "REGRESSION: regression after 3 rounds: step time +" in text
    assert "1.200" in text or "1.19" in text or "1.21" in text  # the per-round ratios
    md = ab_report.render_markdown(result, ref)
    assert "@&#8203;team" in md and "| step time |" in md and "| forward share |" in md
    doc = ab_report.to_json(result, ref, "abc123")
    again = json.loads(json.dumps(doc))
    assert again["verdict"] == "regression"
    assert [r["first"] for r in again["rounds"]] == ["base", "head", "base"]
    assert {i["metric"]: i["status"] for i in again["intervals"]}["forward"] == "regressed"


def test_a_scalar_read_added_per_step_fails_the_ab_naming_its_line(traced) -> None:
    # Real summaries of a loop without and with a loss.item() per step (tests/gate/traced.py),
    # timed on the host clock: the first round's counts decide, at once.
    def measure(side: Side, n: int) -> SideFigures:
        return _fig(10.0) if n > 1 else SideFigures(
            10.0, SHARES, summary=traced["item" if side is Side.HEAD else "base"]
        )

    result = run_rounds(measure)
    assert (result.verdict, len(result.rounds)) == (Verdict.REGRESSION, 1)
    assert result.host_clock and result.intervals == ()
    said = item_site()
    assert result.causes == (said,)
    # the read's own op (_local_scalar_dense) is one more ATen op per step too; the read names it
    assert [r.name for r in result.counters.regressed] == ["counters.syncs_per_step",
                                                           "counters.ops_per_step"]
    assert result.reason() == f"regression after 1 round: {said}"
    text = ab_report.render_text(result, "main").splitlines()
    assert text[1] == f"cause: {said}"
    assert text[-1] == f"REGRESSION: regression after 1 round: {said}"
    md = ab_report.render_markdown(result, "main").splitlines()
    assert md[4] == f"**Cause:** {fmt.markdown(said)}"
    doc = json.loads(json.dumps(ab_report.to_json(result, "main", "abc123")))
    assert doc["verdict"] == "regression" and doc["causes"] == [said]
    syncs = {r["name"]: r for r in doc["counters"]}["counters.syncs_per_step"]
    assert (syncs["base"], syncs["head"], syncs["status"]) == (0, 1, "regressed")


def test_ab_counters_come_from_the_summaries_and_only_a_regression_fails(traced) -> None:
    base, workers0 = traced["base"], traced["workers0"]
    fig = SideFigures.from_summary(workers0, "head.json")
    assert fig.summary is workers0
    assert fig == SideFigures(fig.step_ms, fig.shares, cpu_ms=fig.cpu_ms, thread=fig.thread)
    # A DataLoader setting changed the worse way: the setting decides, naming itself.
    same = [(_fig(10.0), _fig(10.0))] * 2
    rounds = _rounds([(SideFigures(10.0, SHARES, summary=base),
                       SideFigures(10.0, SHARES, summary=workers0)), *same[1:]])
    result = decide(rounds)
    assert result.verdict is Verdict.REGRESSION
    assert result.causes == ("DataLoader num_workers 2 → 0",)
    assert ab_report.render_text(result).splitlines()[1] == "cause: DataLoader num_workers 2 → 0"
    assert [r.name for r in result.counters.regressed] == ["settings.dataloader.num_workers"]
    # Without summaries (the figures alone), nothing is compared and nothing named.
    assert decide(_rounds(same)).counters.rows == () and decide(_rounds(same)).causes == ()
    # The same code on both sides: every counter row ok, no cause.
    equal = decide(_rounds([(SideFigures(10.0, SHARES, summary=base),) * 2, *same[1:]]))
    assert equal.verdict is Verdict.PASS and equal.causes == ()
    assert equal.counters.rows and not equal.counters.regressed


def test_t_quantiles_match_the_published_table() -> None:
    # Student's t quantiles as printed in statistics tables (e.g. NIST's e-Handbook, 1.3.6.7.2)
    table = {(0.975, 1): 12.706, (0.975, 2): 4.303, (0.975, 5): 2.571, (0.975, 30): 2.042,
             (0.995, 1): 63.657, (0.995, 4): 4.604, (0.99, 10): 2.764, (0.95, 3): 2.353}
    for (p, df), value in table.items():
        assert t_quantile(p, df) == pytest.approx(value, abs=1e-3), (p, df)
        assert t_cdf(value, df) == pytest.approx(p, abs=1e-4)
        assert t_cdf(-value, df) == pytest.approx(1 - p, abs=1e-4)


def test_two_rounds_that_agree_on_a_large_shift_are_not_yet_a_regression() -> None:
    # The A/A false alarm seen on a loaded runner: two noisy rounds that happen to agree. A
    # regression needs a third round (and every round moving the same way).
    pairs = [(_fig(10.0), _fig(14.0, forward=50.0, backward=25.0)),
             (_fig(10.0), _fig(14.2, forward=50.5, backward=24.5))]
    two = decide(_rounds(pairs), AbSettings(max_rounds=6))
    assert two.verdict is None
    assert decide(_rounds(pairs), AbSettings(max_rounds=2)).verdict is Verdict.INCONCLUSIVE


def _with_phase_ms(fig: SideFigures) -> SideFigures:
    return SideFigures(fig.step_ms, fig.shares,
                       phase_ms={p: fig.step_ms * (v or 0.0) / 100 for p, v in fig.shares.items()})


def test_a_share_that_rose_while_its_phase_got_faster_is_not_a_regression() -> None:
    # Seen on A/A rounds under random load: the head's runs were less contended, its steps
    # 2-47 % faster, and the dataloader share 3-4 pp higher in all four -- its own time fell.
    moved = [(0.98, 3.4), (0.53, 3.8), (0.72, 4.3), (0.81, 4.2), (0.75, 3.9)]
    base = {"dataloader": 26.0, "backward": 19.0}
    pairs = [(_with_phase_ms(_fig(10.0, **base)),
              _with_phase_ms(_fig(10.0 * r, dataloader=26.0 + d, backward=19.0 - d)))
             for r, d in moved]
    result = decide(_rounds(pairs), AbSettings(max_rounds=5))
    [dl] = [iv for iv in result.intervals if iv.metric == "dataloader"]
    assert dl.low > dl.tolerance and dl.time_grew is False and dl.status is Status.UNDECIDED
    assert result.verdict is Verdict.INCONCLUSIVE
    assert "its phase got faster" in result.reason()
    # the same share shift with the phase's time grown is the regression it looks like
    grown = [(_with_phase_ms(_fig(10.0, **base)),
              _with_phase_ms(_fig(10.0 * 1.05, dataloader=26.0 + d, backward=19.0 - d)))
             for _, d in moved]
    again = decide(_rounds(grown), AbSettings(max_rounds=5))
    assert again.verdict is Verdict.REGRESSION
    assert [iv.metric for iv in again.regressed] == ["dataloader"]


# --- The wait phase (runs with a process group): compared like any other phase -------------

def _summary_fig(ms: dict[str, float]) -> SideFigures:
    """Figures read from a summary (tests/gate/summaries.make) whose step splits into ``ms``."""
    return SideFigures.from_summary(make(ms))


def test_the_wait_share_and_time_are_compared_when_both_sides_have_them() -> None:
    waits = {**BASE_MS, "wait": 5.0}
    base = _summary_fig(waits)
    head = _summary_fig({**waits, "wait": 9.0})  # head's ranks wait 4 ms more per step
    assert list(base.shares) == list(PHASES_WITH_WAIT) == list(base.phase_ms or {})
    assert abs(sum(v or 0.0 for v in head.shares.values()) - 100.0) < 0.05
    result = decide(_rounds([(base, head)] * 3))
    assert [iv.metric for iv in result.intervals[1:]] == list(PHASES_WITH_WAIT)
    assert [iv.metric for iv in result.regressed] == ["step_time", "wait"]  # +16 % step
    (wait,) = (iv for iv in result.intervals if iv.metric == "wait")
    assert wait.time_grew is True  # its ms grew too: the share rose by its own time
    assert abs(wait.estimate - (9.0 / 29.0 - 5.0 / 25.0) * 100.0) < 0.05
    assert "wait share" in result.reason()


def test_single_process_sides_compare_the_five_phases_as_before() -> None:
    base, head = _summary_fig(BASE_MS), _summary_fig(shift(forward=3.0))
    assert list(base.shares) == list(PHASES) == list(base.phase_ms or {})
    result = decide(_rounds([(base, head)] * 3))
    assert [iv.metric for iv in result.intervals[1:]] == list(PHASES)


def _cpu_fig(step_ms: float, cpu_ms: float | None) -> SideFigures:
    return SideFigures(step_ms, dict(SHARES), cpu_ms=cpu_ms)


def test_side_figures_read_cpu_ms_from_a_summary_and_none_where_absent() -> None:
    doc = {"step_time": {"step_ms": {"median": 12.5}, "cpu_ms": 9.25, "forward_pct": 40.0}}
    assert SideFigures.from_summary(doc).cpu_ms == 9.25
    del doc["step_time"]["cpu_ms"]
    assert SideFigures.from_summary(doc).cpu_ms is None
    doc["step_time"]["cpu_ms"] = 0.0  # nothing measured: not a ratio's denominator
    assert SideFigures.from_summary(doc).cpu_ms is None


def test_the_reports_show_the_cpu_columns() -> None:
    pairs = [(_cpu_fig(10.0, 8.0), _cpu_fig(10.0 * (1.3 if n % 2 else 0.7), 9.6 + 0.01 * n))
             for n in range(3)]
    result = decide(_rounds(pairs))
    text = ab_report.render_text(result, "main")
    assert "cpu head/base" in text and "1.200" in text
    md = ab_report.render_markdown(result, "main")
    assert "| base cpu ms |" in md
    doc = json.loads(json.dumps(ab_report.to_json(result, "main", "abc")))
    assert doc["rounds"][0]["base"]["cpu_ms"] == 8.0
    assert math.isclose(doc["rounds"][0]["cpu_ratio"], 1.2)
    # a device clock's verdict rests on the step time and the shares: the CPU ratio is a fact
    assert CPU_METRIC not in {i["metric"] for i in doc["intervals"]}
    # no CPU figures anywhere: no CPU columns
    plain = decide(_rounds([(_fig(10.0), _fig(10.0)), (_fig(10.0), _fig(10.0))]))
    assert "cpu" not in ab_report.render_text(plain, "main")


def test_a_rounds_load_proof_ratios_are_the_runs_own_and_older_figures_are_ignored() -> None:
    """The CPU ratio is head's CPU per step over base's, and the step time without CPU waits
    leaves the waits out on both sides; an older summary's CPU reference and uncontended
    windows (removed) change neither."""
    def side(step: float, cpu: float, wait: float, legacy: bool = False) -> SideFigures:
        st: dict = {"step_ms": {"median": step}, "cpu_ms": cpu,
                    "thread": {"on_cpu_ms": cpu, "cpu_wait_ms": wait, "blocked_ms": 2.0}}
        if legacy:
            st["cpu_reference_ms"] = 0.1
            st["uncontended"] = {"steps": 100, "cpu_ms": 1.0, "on_cpu_ms": 1.0,
                                 "blocked_ms": 1.0, "cpu_reference_ms": 0.1}
        return SideFigures.from_summary({"step_time": st})

    for legacy in (False, True):
        # head: 20 % more CPU per step, and a loaded run (12 ms of waits against 1)
        pair = RoundPair(1, base=side(11.0, 8.0, 1.0), head=side(23.6, 9.6, 12.0, legacy))
        assert pair.cpu_ratio == pytest.approx(1.2)
        assert pair.unloaded_ratio == pytest.approx((9.6 + 2.0) / (8.0 + 2.0))
        assert pair.step_ratio == pytest.approx(23.6 / 11.0)
    no_split = RoundPair(1, base=SideFigures(10.0, dict(SHARES)), head=side(10.0, 8.0, 1.0))
    assert no_split.cpu_ratio is None and no_split.unloaded_ratio is None
