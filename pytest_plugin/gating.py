"""Gate one test's summaries: validate, combine the repeats, compare with the baseline entry,
record the result, and fail the test when the result says so.

A regression is a result: the comparison comes back from the gate as data, and only here is it
turned into a test failure, with the diff table and how to accept the change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from pytest_plugin.results import GateResult, Outcome
from pytest_plugin.state import TracemlState
from pytest_plugin.summaries import MAX_PROBLEMS_SHOWN, summary_problems

#: Width of the diff table in failure messages (columns): wide enough that the tolerance and
#: status columns do not wrap; pytest prints failure text without re-wrapping it.
TABLE_WIDTH = 160

ACCEPT_HINT = "If this change is intended, run with --traceml-update-baseline to accept it."


def no_baseline_note(key: str) -> str:
    return f"no baseline for {key}: run with --traceml-update-baseline"


def gate_summaries(
    state: TracemlState, *, nodeid: str, key: str, docs: Sequence[dict[str, Any]]
) -> GateResult:
    """Gate this test's summaries (one per repeat) under baseline ``key``; records the result
    in ``state`` and raises pytest's Failed when the test must fail."""
    __tracebackhide__ = True
    result, message = _judge(state, nodeid=nodeid, key=key, docs=docs)
    state.record(result)
    if result.outcome.fails:
        pytest.fail(message, pytrace=False)
    return result


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
            result = GateResult(nodeid, key, Outcome.INVALID, problems[0], None, len(docs))
            return result, (
                f"traceml: the summary for {key}{which} does not match the "
                f"final_summary.json schema:\n{shown}"
            )
    from traceml_ci.summary.repeats import combine_repeats

    head = combine_repeats(docs)  # several repeats: each share's median, their spread as noise
    n = len(docs)
    if not opts.gating:
        return GateResult(nodeid, key, Outcome.NOT_GATED, _brief(head), head, n), ""
    base = state.baseline.get(key)
    if base is None:
        if opts.update_baseline:
            return GateResult(nodeid, key, Outcome.UPDATED, "new entry", head, n), ""
        if opts.require_baseline:
            message = (
                f"traceml: no baseline for {key} in {opts.baseline} "
                "(--traceml-require-baseline).\n"
                "Record one: run with --traceml-update-baseline."
            )
            return GateResult(nodeid, key, Outcome.MISSING, "not in the baseline", head, n), message
        return GateResult(nodeid, key, Outcome.NO_BASELINE, no_baseline_note(key), head, n), ""

    from traceml_ci.gate import DEFAULT_RULES, compare, render_text

    comparison = compare(base, head, state.rules or DEFAULT_RULES)
    verdict = comparison.verdict.value
    if opts.update_baseline:
        detail = f"was {verdict}" if verdict != Outcome.PASS.value else "unchanged"
        return GateResult(nodeid, key, Outcome.UPDATED, detail, head, n), ""
    outcome = Outcome(verdict)
    detail = _brief(head, base)
    if outcome in (Outcome.REGRESSION, Outcome.INCOMPARABLE):
        detail = _first_reason(comparison)
    elif outcome is Outcome.WARN:
        warned = [r.name for r in comparison.rows if r.status.value == "warn"]
        if warned:
            detail += "; warn: " + ", ".join(warned)
    result = GateResult(nodeid, key, outcome, detail, head, n)
    if not outcome.fails:
        return result, ""
    median = f" ({n} runs combined)" if n > 1 else ""
    what = "regression" if outcome is Outcome.REGRESSION else "not comparable with the baseline"
    message = (
        f"traceml: {what} for {key}{median} against {opts.baseline}\n\n"
        + render_text(comparison, width=TABLE_WIDTH).rstrip()
        + "\n\n"
        + (ACCEPT_HINT if outcome is Outcome.REGRESSION else
           "Record a baseline on this kind of machine: run with --traceml-update-baseline.")
    )
    return result, message


def _first_reason(comparison: Any) -> str:
    """The reason naming the first regressed metric (rows are in a meaningful order: labels,
    shares, then times), else the first reason the gate gave."""
    regressed = [r.name for r in comparison.rows if r.status.value == "regressed"]
    for name in regressed[:1]:
        for reason in comparison.reasons:
            if reason.startswith(f"{name}:"):
                return reason
    return comparison.reasons[0] if comparison.reasons else comparison.verdict.value


def _brief(head: dict[str, Any], base: dict[str, Any] | None = None) -> str:
    """``COMPUTE_BOUND, step 3.81 ms (base 3.90 ms)`` -- one line for the terminal summary."""
    st = head.get("step_time") or {}
    text = str(st.get("diagnosis", "?"))
    ms = _step_ms(head)
    if ms is not None:
        text += f", step {ms:.3g} ms"
        b = _step_ms(base) if base is not None else None
        if b is not None:
            text += f" (base {b:.3g} ms)"
    return text


def _step_ms(doc: dict[str, Any]) -> float | None:
    try:
        value = doc["step_time"]["step_ms"]["median"]
    except (KeyError, TypeError):
        return None
    return float(value) if isinstance(value, (int, float)) else None
