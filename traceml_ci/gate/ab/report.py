"""Rendering an A/B result (``traceml-ci ab``): plain text, markdown, and the JSON document.

Pure: AbResult -> str or dict. Names that reach here are our own (phase names, the base ref the
user typed, paths) or the summaries' (the causes' module names and file paths); all go through
the medium's escaping helper in ``gate/fmt.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from traceml_ci.gate import fmt
from traceml_ci.gate.ab.intervals import Interval
from traceml_ci.gate.ab.rounds import SideFigures
from traceml_ci.gate.ab.sequential import AbResult
from traceml_ci.gate.render.comparison import markdown_causes, text_causes
from traceml_ci.gate.render.lead import decided_line, timings_line
from traceml_ci.gate.results import Verdict

#: Version of the JSON document ``traceml-ci ab --format json`` prints and writes (2: the
#: contended rule's ``contended``, ``needed_to_pass`` and ``can_regress`` gone with it; 3: the
#: CPU reference's and uncontended windows' figures gone with them).
AB_JSON_VERSION = "3"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _ms(x: float | None) -> str:
    return "-" if x is None else fmt.number(x)


def _interval(iv: Interval) -> str:
    return f"{fmt.delta(iv.low, iv.unit)} .. {fmt.delta(iv.high, iv.unit)}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.0f} %"


def _rows(result: AbResult) -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    """The rounds table and the intervals table as cells (unescaped: our own numbers)."""
    phases = [iv.metric for iv in result.intervals if iv.unit == "pp"]
    # CPU columns wherever a round has the figure (judged only when every round has it).
    cpu = any(r.cpu_ratio is not None for r in result.rounds)
    # The thread's CPU waits and the step time without them, where a round has the split.
    split = any(r.unloaded_ratio is not None for r in result.rounds)
    head = ["round", "first", "base ms", "head ms", "head/base",
            *(["base cpu ms", "head cpu ms", "cpu head/base"] if cpu else []),
            *(["base waits", "head waits", "without waits head/base"] if split else []),
            *(f"{p} Δ" for p in phases)]  # fmt: skip
    rows = []
    for r in result.rounds:
        deltas = [fmt.delta(r.share_delta_pp(p), "pp") for p in phases]
        cpu_cells = [_ms(r.base.cpu_ms), _ms(r.head.cpu_ms), _ratio(r.cpu_ratio)]
        split_cells = [_pct(r.base.cpu_wait_pct), _pct(r.head.cpu_wait_pct),
                       _ratio(r.unloaded_ratio)]
        rows.append(
            [
                str(r.number),
                r.first.value,
                fmt.number(r.base.step_ms),
                fmt.number(r.head.step_ms),
                _ratio(r.step_ratio),
                *(cpu_cells if cpu else []),
                *(split_cells if split else []),
                *deltas,
            ]
        )

    ihead = ["metric", "estimate", "95% interval", "tolerance", "status"]
    irows = [
        [
            iv.label,
            fmt.delta(iv.estimate, iv.unit),
            _interval(iv),
            fmt.delta(iv.tolerance, iv.unit),
            iv.status.value,
        ]
        for iv in result.intervals
    ]
    return head, rows, ihead, irows


def _verdict_word(result: AbResult) -> str:
    return result.verdict.value.upper() if result.verdict else "UNDECIDED"


def _rounds_word(n: int) -> str:
    return f"{n} round{'' if n == 1 else 's'}"


def lead_lines(result: AbResult) -> list[str]:
    """What decided and what the timings show (plain text: escape it). On a host clock the
    first round's pair says both; on a device clock its counts and settings decide beside
    the paired intervals."""
    first = result.pairs[0] if result.pairs else None
    if first is None:
        return []
    if result.host_clock:
        return [x for x in (decided_line(first), timings_line(first)) if x]
    exact = [r for r in first.rows if r.evidence.exact]
    if not exact:
        return [f"Decided by device-clock timings: paired intervals over "
                f"{_rounds_word(len(result.rounds))}"]
    bad = sum(1 for r in exact if r.status.value == "regressed")
    said = f"{bad} regressed of {len(exact)}" if bad else f"all {len(exact)} unchanged"
    return [f"Decided by counts and settings (round 1: {said}) and device-clock timings "
            f"(paired intervals over {_rounds_word(len(result.rounds))})"]


def render_text(result: AbResult, base_ref: str = "") -> str:
    """Plain text for a terminal or CI log: aligned tables, then the verdict line."""
    head, rows, ihead, irows = _rows(result)
    clean: Callable[[Any], str] = fmt.plain
    lines = [
        f"traceml-ci ab: base {clean(base_ref)} vs head (working tree), "
        f"{_rounds_word(len(result.rounds))}, interleaved ABBA"
    ]
    lines += text_causes(result.causes, passed=result.verdict is Verdict.PASS)
    lines += [clean(x) for x in lead_lines(result)]
    for table_head, table_rows in ((head, rows), (ihead, irows)):
        if not table_rows:
            continue
        widths = [max(len(c) for c in col) for col in zip(table_head, *table_rows, strict=False)]
        lines.append("")
        for cells in (table_head, *table_rows):
            lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    lines += ["", f"{_verdict_word(result)}: {clean(result.reason())}"]
    return "\n".join(lines) + "\n"


def render_markdown(result: AbResult, base_ref: str = "") -> str:
    """GitHub markdown: the same tables, input text escaped."""
    head, rows, ihead, irows = _rows(result)
    md = fmt.markdown
    out = [
        f"### traceml-ci A/B: **{_verdict_word(result)}**",
        "",
        f"Base `{md(base_ref)}` against head (the working tree), "
        f"{_rounds_word(len(result.rounds))} run interleaved (ABBA) on one machine.",
        "",
    ]
    out += markdown_causes(result.causes, passed=result.verdict is Verdict.PASS)
    lead = lead_lines(result)
    out += [md(x) for x in lead] + ([""] if lead else [])
    out += [f"<details><summary>Rounds ({len(result.rounds)})"
            f"{' and intervals' if irows else ''}</summary>", ""]
    for table_head, table_rows in ((head, rows), (ihead, irows)):
        if not table_rows:
            continue
        out.append("| " + " | ".join(md(c) for c in table_head) + " |")
        out.append("|" + "---|" * len(table_head))
        out += ["| " + " | ".join(md(c) for c in cells) + " |" for cells in table_rows]
        out.append("")
    out += ["</details>", ""]
    out.append(md(result.reason()))
    return "\n".join(out) + "\n"


def _side_json(side: SideFigures) -> dict[str, Any]:
    """One side's figures of one round, as the JSON document holds them."""
    return {"step_ms": side.step_ms, "cpu_ms": side.cpu_ms,
            "thread": None if side.thread is None else dict(side.thread),
            "shares_pct": dict(side.shares)}


def to_json(result: AbResult, base_ref: str = "", base_commit: str = "") -> dict[str, Any]:
    """The machine-readable document (``--format json``, ``<out>/ab.json``)."""
    s = result.settings
    return fmt.json_safe({
        "ab_version": AB_JSON_VERSION,
        "verdict": result.verdict.value if result.verdict else None,
        "reason": result.reason(),
        "causes": list(result.causes),
        "base": {"ref": base_ref, "commit": base_commit},
        "cpu_wait_pct": result.cpu_wait_pct,
        "settings": {"step_tol_pct": s.step_tol_pct, "share_tol_pp": s.share_tol_pp,
                     "min_rounds": s.min_rounds, "max_rounds": s.max_rounds},
        "rounds": [
            {"round": r.number, "first": r.first.value,
             "base": _side_json(r.base), "head": _side_json(r.head),
             "step_ratio": r.step_ratio, "cpu_ratio": r.cpu_ratio,
             "unloaded_ratio": r.unloaded_ratio}
            for r in result.rounds
        ],
        "intervals": [
            {"metric": iv.metric, "unit": iv.unit, "estimate": iv.estimate, "low": iv.low,
             "high": iv.high, "tolerance": iv.tolerance, "status": iv.status.value,
             "per_round": list(iv.per_round), "phase_time_grew": iv.time_grew}
            for iv in result.intervals
        ],
        "counters": [r.to_dict() for r in result.counters.rows],
        "clock": "host" if result.host_clock else "device",
        "confirmed": list(result.confirmed),
        "lead": lead_lines(result),
    })  # fmt: skip
