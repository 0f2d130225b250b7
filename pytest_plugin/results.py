"""What gating one traced test produced: an outcome, one line for the terminal, the summary."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class Outcome(str, Enum):
    """How a traced test's summary fared. The first four are the gate's own verdicts."""

    PASS = "pass"
    WARN = "warn"
    REGRESSION = "regression"
    INCOMPARABLE = "incomparable"
    NO_BASELINE = "no baseline"  # nothing to compare with: passes with a note ...
    MISSING = "missing baseline"  # ... or fails under --traceml-require-baseline
    UPDATED = "updated"  # --traceml-update-baseline: accepted into the baseline
    NOT_GATED = "recorded"  # no --traceml-baseline: traced and validated only
    INVALID = "invalid summary"

    @property
    def fails(self) -> bool:
        return self in _FAILING


_FAILING = frozenset({Outcome.REGRESSION, Outcome.INCOMPARABLE, Outcome.MISSING, Outcome.INVALID})


@dataclass(frozen=True)
class GateResult:
    """One gated summary. ``summary`` is None when there was no valid one to keep."""

    nodeid: str
    key: str
    outcome: Outcome
    detail: str = ""
    summary: dict[str, Any] | None = None
    repeats: int = 1

    def to_dict(self) -> dict[str, Any]:
        """Plain data, for pytest-xdist's worker -> controller channel."""
        return {
            "nodeid": self.nodeid,
            "key": self.key,
            "outcome": self.outcome.value,
            "detail": self.detail,
            "summary": self.summary,
            "repeats": self.repeats,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GateResult:
        return cls(
            nodeid=str(d["nodeid"]),
            key=str(d["key"]),
            outcome=Outcome(d["outcome"]),
            detail=str(d.get("detail", "")),
            summary=d.get("summary"),
            repeats=int(d.get("repeats", 1)),
        )
