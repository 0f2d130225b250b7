"""The ``traceml`` section of pytest's terminal summary: every gated test and its verdict."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from pytest_plugin.results import GateResult, Handling

if TYPE_CHECKING:  # pragma: no cover
    from pytest_plugin.ab import AbOutcome

#: Markup per verdict or handling (by its word), for terminals that show colour.
_MARKUP: dict[str, dict[str, bool]] = {
    "pass": {"green": True},
    "warn": {"yellow": True},
    "regression": {"red": True, "bold": True},
    "incomparable": {"red": True},
    Handling.NO_BASELINE.value: {"yellow": True},
    Handling.MISSING.value: {"red": True},
    Handling.UPDATED.value: {"cyan": True},
    Handling.NOT_GATED.value: {},
    Handling.INVALID.value: {"red": True, "bold": True},
    # --traceml-ab's words (pass and regression as above)
    "inconclusive": {"yellow": True, "bold": True},
    "no base": {"yellow": True},
}

_WIDTH = max(len(word) for word in _MARKUP)


def result_lines(results: Iterable[GateResult]) -> list[tuple[str, dict[str, bool]]]:
    """One ``(text, markup)`` per result, sorted by node id then key."""
    out = []
    for r in sorted(results, key=lambda r: (r.nodeid, r.key)):
        label = r.label.upper().ljust(_WIDTH)
        name = r.nodeid if r.key == r.nodeid else f"{r.nodeid} [key {r.key}]"
        repeats = f" (×{r.repeats} runs)" if r.repeats > 1 else ""
        detail = f"  {r.detail}" if r.detail else ""
        out.append((f"{label}  {name}{repeats}{detail}", _MARKUP.get(r.label, {})))
    return out


def ab_lines(outcomes: Iterable[AbOutcome]) -> list[tuple[str, dict[str, bool]]]:
    """One ``(text, markup)`` per A/B test, sorted by node id: ``A/B REGRESSION  nodeid  why``
    (a verdict that does not fail its test says so)."""
    from traceml_ci.gate.fmt import plain

    out = []
    for o in sorted(outcomes, key=lambda o: o.nodeid):
        label = f"A/B {o.verdict.upper()}".ljust(_WIDTH)
        name = o.nodeid if o.key == o.nodeid else f"{o.nodeid} [key {o.key}]"
        kept = "" if o.fails or o.verdict in ("pass", "no base") else " (does not fail the test)"
        out.append((plain(f"{label}  {name}  {o.detail}{kept}"), _MARKUP.get(o.verdict, {})))
    return out


def write_section(reporter: object, results: list[GateResult], notes: list[str],
                  errors: list[str], verdict: str | None = None,
                  ab: Iterable[AbOutcome] = ()) -> None:
    """Write the section through pytest's TerminalReporter; nothing at all when empty.
    ``verdict``: the session's verdict line, from the same comparison as the report.
    ``ab``: the tests judged by --traceml-ab."""
    ab = list(ab)
    if not (results or notes or errors or ab):
        return
    write_sep = reporter.write_sep  # type: ignore[attr-defined]
    write_line = reporter.write_line  # type: ignore[attr-defined]
    write_sep("-", "traceml")
    for text, markup in ab_lines(ab) + result_lines(results):
        write_line(text, **markup)
    if verdict:
        write_line(f"traceml: {verdict}")
    for note in notes:
        write_line(f"traceml: {note}")
    for error in errors:
        write_line(f"traceml: error: {error}", red=True, bold=True)
