"""Renderers for a profiled run's top ops and their base -> head deltas (markdown and terminal).

Pure functions over ``summary/profile.py``'s data. Op names come from the profiled program
(any ``record_function`` label), so they are input text: ``fmt.markdown`` in markdown,
``fmt.plain`` in terminal text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from traceml_ci.gate import fmt
from traceml_ci.summary.profile import OpDelta, TopOps, op_deltas

#: Rows in a delta table: the largest changes are what a reader looks at.
MAX_DELTA_ROWS = 10


@dataclass(frozen=True)
class ProfiledRun:
    """What the escalation produced for one key: the head's top ops, the baseline entry's (if
    it was recorded with a profile), where the trace is, the re-run's seconds, the trace's
    size in bytes."""

    key: str
    head: TopOps
    base: TopOps | None = None
    trace: str = ""
    seconds: float | None = None
    trace_bytes: int | None = None

    @property
    def deltas(self) -> list[OpDelta] | None:
        return op_deltas(self.base, self.head) if self.base is not None else None


def _ms(x: float | None) -> str:
    return "—" if x is None else fmt.number(x)


def _top_rows(top: TopOps, escape: Callable[[object], str]) -> tuple[list[list[str]], list[str]]:
    device = any(o.device_self_ms is not None for o in top.ops)
    headers = ["op", "host ms/step"] + (["device ms/step"] if device else []) + [
        "calls/step", "share"]
    rows = []
    for o in top.ops:
        row = [escape(o.name), _ms(o.host_self_ms)]
        if device:
            row.append(_ms(o.device_self_ms))
        row += [fmt.number(o.calls), f"{fmt.number(o.share_pct)}%"]
        rows.append(row)
    return rows, headers


def _delta_rows(deltas: Sequence[OpDelta], escape: Callable[[object], str]) -> list[list[str]]:
    rows = []
    for d in deltas[:MAX_DELTA_ROWS]:
        note = " (new)" if d.base_ms is None else " (gone)" if d.head_ms is None else ""
        sign = "+" if d.delta_ms > 0 else "−" if d.delta_ms < 0 else ""
        rows.append([escape(d.name) + note, _ms(d.base_ms), _ms(d.head_ms),
                     f"{sign}{fmt.number(abs(d.delta_ms))}"])
    return rows


_DELTA_HEADERS = ["op", "base ms/step", "head ms/step", "Δ ms"]


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{max(1, round(n / 1e3))} kB"


def describe(p: ProfiledRun) -> str:
    """``5 steps on cpu, re-run 2.1 s, trace 340 kB`` (plain text; escaped by the caller)."""
    parts = [f"{p.head.steps} profiled step{'s' if p.head.steps != 1 else ''} on {p.head.device}"]
    if p.seconds is not None:
        parts.append(f"re-run {p.seconds:.1f} s")
    if p.trace_bytes is not None:
        parts.append(f"trace {_size(p.trace_bytes)}")
    return ", ".join(parts)


def markdown_section(runs: Sequence[ProfiledRun]) -> str:
    """The report's "Profiles of regressed tests" section ('' when there are none): per key, the
    top ops by self time per step and, when the baseline had a profile, the largest changes."""
    from traceml_ci.gate.fmt import github_table

    if not runs:
        return ""
    out = ["### Profiles of regressed tests", "",
           "Each regressed test ran once more under `torch.profiler`; the trace (Perfetto, "
           "chrome://tracing, HTA) is in the artifact.", ""]
    for p in runs:
        out += [f"#### {fmt.markdown(p.key)}", "", fmt.markdown(describe(p))
                + (f" · trace: {fmt.markdown(p.trace)}" if p.trace else ""), ""]
        rows, headers = _top_rows(p.head, fmt.markdown)
        out += ["Top ops by self time:", "", github_table(rows, headers), ""]
        deltas = p.deltas
        if deltas:
            out += ["Largest changes, base → head (new, gone: not in the other side's top ops):",
                    "",
                    github_table(_delta_rows(deltas, fmt.markdown), _DELTA_HEADERS), ""]
    return "\n".join(out)


def text_section(p: ProfiledRun) -> str:
    """The same for a terminal (the pytest failure message): plain-escaped op names."""
    import tabulate

    rows, headers = _top_rows(p.head, fmt.plain)
    out = [f"traceml: profile of a re-run under torch.profiler ({describe(p)})"]
    if p.trace:
        out.append(f"trace: {fmt.plain(p.trace)}")
    out += ["top ops by self time:",
            tabulate.tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)]
    deltas = p.deltas
    if deltas:
        out += ["largest changes, base -> head:",
                tabulate.tabulate(_delta_rows(deltas, fmt.plain), headers=_DELTA_HEADERS,
                                  tablefmt="simple", disable_numparse=True)]
    return "\n".join(out)
