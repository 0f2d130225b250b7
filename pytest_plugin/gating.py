"""Gate one test's summaries: validate, combine the repeats, compare with the baseline entry,
record the result, and fail the test when the result says so.

A regression is a result: the comparison comes back from the gate as data, and only here is it
turned into a test failure, with the diff table and how to accept the change. Before that, a
regression -- or a result that came close -- is confirmed (``--traceml-confirm``): the job runs
again, up to K more times, and fails only if all its runs combined still regress
(``traceml_ci.gate.confirm``; docs/pytest-plugin.md, "Confirmation").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest

from pytest_plugin.profiling import ProfileJob, after_gate
from pytest_plugin.results import GateResult, Handling
from pytest_plugin.state import TracemlState
from pytest_plugin.summaries import MAX_PROBLEMS_SHOWN, summary_problems

#: Width of the diff table in failure messages (columns): wide enough that the tolerance and
#: status columns do not wrap; pytest prints failure text without re-wrapping it.
TABLE_WIDTH = 160

ACCEPT_HINT = "If this change is intended, run with --traceml-update-baseline to accept it."


def no_baseline_note(key: str) -> str:
    return f"no baseline for {key}: run with --traceml-update-baseline"


def gate_summaries(
    state: TracemlState,
    *,
    nodeid: str,
    key: str,
    docs: Sequence[dict[str, Any]],
    rerun: Callable[[], dict[str, Any]] | None = None,
    profile: ProfileJob | None = None,
) -> GateResult:
    """Gate this test's summaries (one per repeat) under baseline ``key``; records the result
    in ``state`` and raises pytest's Failed when the test must fail.

    ``rerun``: runs the job once more and returns its summary. When the runs so far regress or
    come close, it is called up to ``--traceml-confirm`` times, each new run combined with the
    earlier ones, until the combination is clean (``traceml_ci.gate.confirm``).

    ``profile(out_dir, steps)``: runs the job once more with ``steps`` profiled, for
    ``--traceml-profile-on-regression`` (a confirmed regression) and ``--traceml-profile``
    (the baseline's top ops); see ``pytest_plugin.profiling``. It never changes the verdict."""
    __tracebackhide__ = True
    from traceml_ci.gate.confirm import confirm

    def judge(runs: Sequence[dict[str, Any]]) -> tuple[GateResult, str]:
        return _judge(state, nodeid=nodeid, key=key, docs=runs)

    done = confirm(
        docs, judge,
        regressed=lambda judged: _regressed(judged[0]),
        suspect=lambda judged: _suspect(state, judged[0]),
        rerun=None if state.options.update_baseline else rerun,
        max_reruns=state.options.confirm,
    )
    result, message = done.result
    if done.reruns:
        result, message = _with_confirmation(result, message, done.reruns, len(done.docs),
                                             first_regressed=_regressed(done.first[0]),
                                             first_left_out=done.first_run_discounted)
    result, message = after_gate(state, result, message, profile)
    state.record(result)
    if result.fails:
        pytest.fail(message, pytrace=False)
    return result


def _regressed(result: GateResult) -> bool:
    from traceml_ci.gate import Verdict

    return result.verdict is Verdict.REGRESSION


def _suspect(state: TracemlState, result: GateResult) -> bool:
    """Whether a result that did not regress came close enough to be worth another run."""
    base = state.baseline.get(result.key)
    if result.comparison is None or result.summary is None or base is None:
        return False
    from traceml_ci.gate.confirm import worth_confirming

    return worth_confirming(result.comparison, base, result.summary)


def _with_confirmation(
    result: GateResult, message: str, extra: int, runs: int, *, first_regressed: bool,
    first_left_out: bool = False,
) -> tuple[GateResult, str]:
    """Say what confirmation did: whether the first run regressed or only came close, and
    whether ``runs`` runs combined regress. ``first_left_out``: the verdict is the re-runs'
    alone (the run count said is theirs, as the result's ``×N runs`` label says)."""
    if _regressed(result):
        if first_regressed:
            note = f"confirmed: {runs} runs combined still regress ({extra} re-run(s))"
        else:
            note = f"the first run came close; {runs} runs combined regress ({extra} re-run(s))"
        message = message.replace("\n\n", f"\n{note}\n\n", 1)
    elif first_regressed:
        judged = (f"{extra} re-run(s) combined, the first run left out" if first_left_out
                  else f"{runs} runs combined")
        note = (f"the first run looked like a regression; not confirmed by {extra} re-run(s) "
                f"({judged})")
    else:
        note = f"the first run came close; not a regression over {runs} runs combined"
    detail = f"{result.detail}; {note}" if result.detail else note
    return replace(result, detail=detail), message


def _judge(
    state: TracemlState, *, nodeid: str, key: str, docs: Sequence[dict[str, Any]]
) -> tuple[GateResult, str]:
    opts = state.options
    for i, doc in enumerate(docs):
        problems = summary_problems(doc)
        if problems:
            which = f" (repeat {i + 1} of {len(docs)})" if len(docs) > 1 else ""
            shown = "\n".join(f"  {p}" for p in problems[:MAX_PROBLEMS_SHOWN])
            more = len(problems) - MAX_PROBLEMS_SHOWN
            if more > 0:
                shown += f"\n  ... and {more} more"
            result = GateResult(nodeid, key, Handling.INVALID, problems[0], None, len(docs))
            return result, (
                f"traceml: the summary for {key}{which} does not match the "
                f"final_summary.json schema:\n{shown}"
            )
    from traceml_ci.summary.repeats import combine_repeats

    head = combine_repeats(docs)  # several repeats: each share's mean, their spread as noise
    n = len(docs)
    if not opts.gating:
        return GateResult(nodeid, key, Handling.NOT_GATED, _brief(head), head, n), ""
    base = state.baseline.get(key)
    contended = _contended_note(head) if opts.update_baseline else ""
    if base is None:
        if opts.update_baseline:
            return GateResult(nodeid, key, Handling.UPDATED, "new entry" + contended, head, n), ""
        if opts.require_baseline:
            message = (
                f"traceml: no baseline for {key} in {opts.baseline} "
                "(--traceml-require-baseline).\n"
                "Record one: run with --traceml-update-baseline."
            )
            result = GateResult(nodeid, key, Handling.MISSING, "not in the baseline", head, n)
            return result, message
        return GateResult(nodeid, key, Handling.NO_BASELINE, no_baseline_note(key), head, n), ""

    from traceml_ci.gate import DEFAULT_RULES, Status, Verdict, render_text
    from traceml_ci.gate.judge import judge

    # One entry each side: judge() compares the pair (the session's set is assembled from
    # these per-test comparisons, never compared again: state.session_comparison).
    comparison = judge({key: base}, {key: head}, state.rules or DEFAULT_RULES)
    verdict = comparison.verdict
    if opts.update_baseline:
        detail = f"was {verdict.value}" if verdict is not Verdict.PASS else "unchanged"
        detail += contended
        return GateResult(nodeid, key, Handling.UPDATED, detail, head, n, comparison), ""
    detail = _brief(head, base)
    if verdict in (Verdict.REGRESSION, Verdict.INCOMPARABLE):
        detail = _first_reason(comparison)
    elif verdict is Verdict.WARN:
        warned = [r.name for r in comparison.rows if r.status is Status.WARN]
        if warned:
            detail += "; warn: " + ", ".join(warned)
    result = GateResult(nodeid, key, Handling.COMPARED, detail, head, n, comparison,
                        enforced=not opts.report_only)
    if not result.fails:
        return result, ""
    combined = f" ({n} runs combined)" if n > 1 else ""
    what = "regression" if verdict is Verdict.REGRESSION else "not comparable with the baseline"
    message = (
        f"traceml: {what} for {key}{combined} against {opts.baseline}\n\n"
        + render_text(comparison, width=TABLE_WIDTH, wrap_reasons=False).rstrip()
        + "\n\n"
        + (ACCEPT_HINT if verdict is Verdict.REGRESSION else
           "Record a baseline on this kind of machine: run with --traceml-update-baseline.")
    )
    return result, message


def _contended_note(head: dict[str, Any]) -> str:
    """Said when a baseline entry is recorded: its runs waited for a CPU (the most any of them
    did; the entry keeps that figure, and the gate excuses shifts it can explain). Shares
    recorded under load carry it into every later comparison."""
    from traceml_ci.summary.keys import CONTENDED_RUNQUEUE_WAIT_PCT
    from traceml_ci.summary.view import SummaryView

    wait = SummaryView(head).runqueue_wait_pct
    if wait is None or wait < CONTENDED_RUNQUEUE_WAIT_PCT:
        return ""
    return (f"; recorded on a contended CPU (runqueue wait {wait:.0f} %): re-record it on a "
            "quiet runner")


def _first_reason(comparison: Any) -> str:
    """The first cause the gate names (gate/causes.py: a DataLoader setting, a counter), else
    the reason naming the first regressed metric (rows are in a meaningful order: labels,
    shares, then times), else the first reason the gate gave."""
    from traceml_ci.gate.render.comparison import shown_causes, text_causes

    causes = shown_causes(comparison)
    if causes:
        return text_causes(causes[:1], passed=False)[0]
    regressed = [r.name for r in comparison.rows if r.status.value == "regressed"]
    for name in regressed[:1]:
        for reason in comparison.reasons:
            if reason.startswith(f"{name}:"):
                return reason
    return comparison.reasons[0] if comparison.reasons else comparison.verdict.value


def _brief(head: dict[str, Any], base: dict[str, Any] | None = None) -> str:
    """``COMPUTE_BOUND, step 3.81 ms (base 3.90 ms)`` -- one line for the terminal summary."""
    from traceml_ci.summary.view import SummaryView

    view = SummaryView(head)
    text = view.text(("step_time", "diagnosis")) or "?"
    ms = view.step_ms()
    if ms is not None:
        text += f", step {ms:.3g} ms"
        b = SummaryView(base).step_ms() if base is not None else None
        if b is not None:
            text += f" (base {b:.3g} ms)"
    return text
