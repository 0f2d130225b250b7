"""The ``traceml`` section of pytest's terminal summary: every gated test and its verdict."""

from __future__ import annotations

from collections.abc import Iterable

from pytest_plugin.results import GateResult, Outcome

#: Markup per outcome, for terminals that show colour.
_MARKUP: dict[Outcome, dict[str, bool]] = {
    Outcome.PASS: {"green": True},
    Outcome.WARN: {"yellow": True},
    Outcome.REGRESSION: {"red": True, "bold": True},
    Outcome.INCOMPARABLE: {"red": True},
    Outcome.NO_BASELINE: {"yellow": True},
    Outcome.MISSING: {"red": True},
    Outcome.UPDATED: {"cyan": True},
    Outcome.NOT_GATED: {},
    Outcome.INVALID: {"red": True, "bold": True},
}

_WIDTH = max(len(o.value) for o in Outcome)


def result_lines(results: Iterable[GateResult]) -> list[tuple[str, dict[str, bool]]]:
    """One ``(text, markup)`` per result, sorted by node id then key."""
    out = []
    for r in sorted(results, key=lambda r: (r.nodeid, r.key)):
        label = r.outcome.value.upper().ljust(_WIDTH)
        name = r.nodeid if r.key == r.nodeid else f"{r.nodeid} [key {r.key}]"
        repeats = f" (×{r.repeats} runs)" if r.repeats > 1 else ""
        detail = f"  {r.detail}" if r.detail else ""
        out.append((f"{label}  {name}{repeats}{detail}", _MARKUP[r.outcome]))
    return out


def write_section(reporter: object, results: list[GateResult], notes: list[str],
                  errors: list[str]) -> None:
    """Write the section through pytest's TerminalReporter; nothing at all when empty."""
    if not (results or notes or errors):
        return
    write_sep = reporter.write_sep  # type: ignore[attr-defined]
    write_line = reporter.write_line  # type: ignore[attr-defined]
    write_sep("-", "traceml")
    for text, markup in result_lines(results):
        write_line(text, **markup)
    for note in notes:
        write_line(f"traceml: {note}")
    for error in errors:
        write_line(f"traceml: error: {error}", red=True, bold=True)
