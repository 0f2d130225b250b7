"""The gate's results: Status and Verdict, the Tolerance a row was judged by, Row, Comparison and
SetComparison, and their JSON (``--format json``). Pure data; no judging here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from traceml_ci.gate import fmt
from traceml_ci.gate.metrics import Kind
from traceml_ci.gate.rules import Direction, Rule

#: The rows of the deterministic counters (gate/counted/counters.py) are named ``counters.*``.
COUNTERS_PREFIX = "counters."

#: Version of the JSON report (``--format json``). 1.1: each row says its ``evidence``.
REPORT_VERSION = "1.1"


class Status(str, Enum):
    """The outcome of one metric."""

    OK = "ok"
    IMPROVED = "improved"
    WARN = "warn"
    REGRESSED = "regressed"
    NEW = "new"  # only head has a value
    MISSING = "missing"  # only base has a value


class Evidence(str, Enum):
    """What a row's figure is, which decides what it may do to the verdict (docs/gate.md, "The
    rule"): counts and settings are exact and decide; a time on a device clock decides under
    the noise rules; a time on a host clock informs, and fails alone only far past what load
    can do; memory is measured bytes and gates under its tolerance."""

    COUNT = "count"  # an exact counter of one sampled step (gate/counted/counters.py)
    SETTING = "setting"  # a setting that changes cost: a change fails until accepted
    DEVICE_CLOCK = "device clock"  # timed with device events (CUDA): decides
    HOST_CLOCK = "host clock"  # timed on the host: informs (docs/gate.md, "The rule")
    MEMORY = "memory"  # bytes measured (RSS, the allocator's peaks)
    DEVICE = "device"  # sampled from the device (utilisation)

    @property
    def exact(self) -> bool:
        """Counts and settings: the same on every run of the same code, never re-run."""
        return self in (Evidence.COUNT, Evidence.SETTING)

    @property
    def timed(self) -> bool:
        return self in (Evidence.DEVICE_CLOCK, Evidence.HOST_CLOCK)


class Verdict(str, Enum):
    """The outcome of a whole comparison, stored-baseline or A/B. The CLI maps it to an exit
    code (cli/diff.py: ``exit_code``): 1 for a regression and nothing else."""

    PASS = "pass"
    WARN = "warn"
    REGRESSION = "regression"
    INCOMPARABLE = "incomparable"
    #: A/B on a device clock: the rounds' intervals still straddle a tolerance at the cap. No
    #: evidence of a regression: passes with a note unless the user asks it to fail.
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class Tolerance:
    """The rule a row was judged by, as shown in reports."""

    rule: Rule
    kind: Kind
    unit: str
    higher_is_worse: bool = True
    #: Whether past the fail tier regresses (the rule's ``fail``, or the host-clock default).
    fails: bool = True
    #: On a host clock, the rule's own tiers as text when ``rule`` is the band that replaced
    #: them (they only say that the figure moved): shown beside the band.
    informs: str = ""

    def __str__(self) -> str:
        r = self.rule
        if self.informs and not self.fails:
            return "informs (host clock)"
        if self.kind is Kind.LABEL:
            text = "any change" if r.direction is Direction.ANY else "no worse label"
            return text if self.fails else f"{text} (warn only)"
        sign = "±" if r.direction is Direction.ANY else ("+" if self.higher_is_worse else "−")
        fail = self._tier(r.abs, r.rel, sign)
        warn = self._tier(r.warn_abs, r.warn_rel, sign)
        if fail and warn:
            text = f"{fail} (warn {warn})"
        else:
            text = fail or (f"warn {warn}" if warn else "")
        if self.informs:  # the band decides; the rule's own tiers are in the row's note
            return f"{text} host-clock band"
        return text if self.fails or not text else f"{text}, warn only"

    def _tier(self, a: float | None, rel: float | None, sign: str) -> str:
        unit = "pp" if self.kind is Kind.PCT else self.unit
        parts = []
        if rel is not None:
            parts.append(f"{sign}{rel:g}%")
        if a is not None:
            parts.append(f"{sign}{a:g} {unit}")
        return " and ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        out = {**self.rule.to_dict(), "fails": self.fails, "text": str(self)}
        if self.informs:
            out["informs"] = self.informs
        return out


@dataclass(frozen=True)
class Row:
    """One metric compared.

    ``delta``: percentage points for ``*_pct``; percent of base for times, memory and rates;
    MB per 1k steps for the growth slope; None for labels or when base is 0.
    ``tolerance``: None for informational rows, which never gate.
    ``noise``: how far the change had to go to clear the noise (noise_factor × combined IQR),
    in the metric's own unit; None when the summaries report no spread for it.
    ``cause``: what changed, in the few words a headline names it by (gate/causes.py); the
    deterministic counters set it, the start of their ``note``; empty on every other row.
    ``evidence``: what the figure is (a count, a setting, a time on which clock, memory),
    which says what it may do to the verdict.
    """

    name: str
    base: float | str | None
    head: float | str | None
    delta: float | None
    tolerance: Tolerance | None
    status: Status
    unit: str = ""
    delta_unit: str = ""
    noise: float | None = None
    note: str = ""
    cause: str = ""
    evidence: Evidence = Evidence.COUNT

    @property
    def gating(self) -> bool:
        return self.tolerance is not None

    @property
    def changed(self) -> bool:
        """Whether the row is worth showing unfolded: anything but a quiet ok, and a host-clock
        timing that only moved (the report's timings line says it)."""
        if self.status is Status.OK and self.evidence is Evidence.HOST_CLOCK:
            return False
        return self.status is not Status.OK or bool(self.note)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "base": self.base,
            "head": self.head,
            "delta": self.delta,
            "delta_unit": self.delta_unit,
            "unit": self.unit,
            "tolerance": self.tolerance.to_dict() if self.tolerance else None,
            "noise": self.noise,
            "status": self.status.value,
            "note": self.note,
            "evidence": self.evidence.value,
        }


@dataclass(frozen=True)
class Comparison:
    """A head summary against its base: one row per metric, the verdict and why.

    ``reasons``: the context (``notes``), then one line per regressed row. ``causes``: what
    the summaries say changed (a DataLoader setting, a counter), for the headline
    (gate/causes.py), the surest first.
    """

    verdict: Verdict
    rows: list[Row]
    reasons: list[str]
    base_run: str = ""
    head_run: str = ""
    skipped: list[str] = field(default_factory=list)
    rules_source: str = "defaults"
    #: The reasons that are not about one row (environment, mapping, noise, run status).
    notes: list[str] = field(default_factory=list)
    #: The ``distributed`` blocks of base and head (None for a single process), for the
    #: renderers' per-rank section; not part of the JSON report (its rows carry the verdict).
    distributed: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None] = (None, None)
    causes: list[str] = field(default_factory=list)
    #: Each side's phase shares (``SummaryView.shares``: its own phases, the wait phase where
    #: the run had one, in display order), for the charts, which draw what each summary has
    #: even where a phase only one side has is no row; not part of the JSON report.
    splits: tuple[Mapping[str, float | None] | None, Mapping[str, float | None] | None] = (
        None, None)

    def row(self, name: str) -> Row | None:
        return next((r for r in self.rows if r.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": REPORT_VERSION,
            "kind": "comparison",
            "verdict": self.verdict.value,
            "reasons": list(self.reasons),
            "causes": list(self.causes),
            "base_run": self.base_run,
            "head_run": self.head_run,
            "rules": self.rules_source,
            "skipped": list(self.skipped),
            "rows": [r.to_dict() for r in self.rows],
        }


@dataclass(frozen=True)
class SetComparison:
    """Baseline sets compared key by key (e.g. one summary per test id)."""

    verdict: Verdict
    items: dict[str, Comparison]
    added: list[str]
    removed: list[str]
    reasons: list[str]
    rules_source: str = "defaults"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": REPORT_VERSION,
            "kind": "set",
            "verdict": self.verdict.value,
            "reasons": list(self.reasons),
            "rules": self.rules_source,
            "added": list(self.added),
            "removed": list(self.removed),
            "items": {k: {**c.to_dict(), "kind": "comparison"} for k, c in self.items.items()},
        }


def with_status(row: Row, status: Status, note: str) -> Row:
    """``row`` with another status and note (what a guard does to a row)."""
    return Row(
        row.name,
        row.base,
        row.head,
        row.delta,
        row.tolerance,
        status,
        row.unit,
        row.delta_unit,
        row.noise,
        note,
        row.cause,
        row.evidence,
    )


def verdict_of(rows: list[Row], run_warn: bool = False) -> Verdict:
    """A comparison's verdict from its rows: incomparable when no gated row has a value on both
    sides, else the worst status; ``run_warn`` (the head run did not complete) makes a pass a
    warning."""
    judged = [r for r in rows if r.gating and r.status not in (Status.NEW, Status.MISSING)]
    if not judged:
        return Verdict.INCOMPARABLE
    if any(r.status is Status.REGRESSED for r in rows):
        return Verdict.REGRESSION
    if run_warn or any(r.status in (Status.WARN, Status.MISSING) for r in rows):
        return Verdict.WARN
    return Verdict.PASS


def describe(row: Row) -> str:
    """One line for the reasons: what regressed, by how much, against which tolerance."""
    change = f"{fmt.value(row.base, row.unit)} → {fmt.value(row.head, row.unit)}"
    d = fmt.delta(row.delta, row.delta_unit)
    detail = "; ".join(x for x in (d, f"tolerance {row.tolerance}" if row.tolerance else "") if x)
    # A counter's row carries the sentence that says what changed (gate/counted/counters.py); any
    # other regressed row's note says what moved it (the sampled modules a forward or backward
    # share names, a label's change): the line must say it whole, not only a table cell that
    # a terminal's width may wrap.
    if not row.note:
        said = ""
    elif row.name.startswith(COUNTERS_PREFIX):
        said = f": {row.note}"
    else:
        said = f" — {row.note}"
    return f"{row.name}: {change}" + (f" ({detail})" if detail else "") + said
