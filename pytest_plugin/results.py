"""What gating one traced test produced: how it was handled, the gate's verdict, the summary."""

from __future__ import annotations

import base64
import pickle
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from traceml_ci.gate import Comparison, Verdict
    from traceml_ci.gate.render.ops import ProfiledRun


class Handling(str, Enum):
    """What the plugin did with a traced test's summary. Only ``COMPARED`` has a verdict (the
    gate's own ``Verdict``); the others are the plugin's states around it."""

    COMPARED = "compared"  # against its baseline entry: see GateResult.verdict
    NO_BASELINE = "no baseline"  # nothing to compare with: passes with a note ...
    MISSING = "missing baseline"  # ... or fails under --traceml-require-baseline
    UPDATED = "updated"  # --traceml-update-baseline: accepted into the baseline
    NOT_GATED = "recorded"  # no --traceml-baseline: traced and validated only
    INVALID = "invalid summary"


@dataclass(frozen=True)
class GateResult:
    """One gated summary. ``summary`` is None when there was no valid one to keep;
    ``comparison`` is the gate's comparison with the baseline entry, when there was one (the
    session's report is assembled from these, never compared again)."""

    nodeid: str
    key: str
    handling: Handling
    detail: str = ""
    summary: dict[str, Any] | None = None
    repeats: int = 1
    comparison: Comparison | None = None
    #: Whether a failing verdict fails the test (False under --traceml-report-only).
    enforced: bool = True
    #: --traceml-profile-on-regression: the profiled re-run of a regressed test (its top ops).
    profile: ProfiledRun | None = None
    #: Why that profile could not be taken ("" when it was, or was not asked for).
    profile_error: str = ""

    @property
    def verdict(self) -> Verdict | None:
        """The gate's verdict for a compared summary, else None."""
        if self.handling is Handling.COMPARED and self.comparison is not None:
            return self.comparison.verdict
        return None

    @property
    def label(self) -> str:
        """The word the terminal shows: the gate's verdict, or how the summary was handled."""
        verdict = self.verdict
        return verdict.value if verdict is not None else self.handling.value

    @property
    def fails(self) -> bool:
        """Whether this result fails its test."""
        if self.handling in (Handling.MISSING, Handling.INVALID):
            return True
        verdict = self.verdict
        if verdict is None or not self.enforced:
            return False
        from traceml_ci.gate import Verdict  # loaded already: a verdict came from it

        return verdict in (Verdict.REGRESSION, Verdict.INCOMPARABLE)

    def to_dict(self) -> dict[str, Any]:
        """Plain data, for pytest-xdist's worker -> controller channel. The comparison travels
        pickled: the channel joins this session's own processes, and the controller must not
        compare the pair a second time."""
        blob = pickle.dumps(self.comparison) if self.comparison is not None else None
        profile = pickle.dumps(self.profile) if self.profile is not None else None
        return {
            "nodeid": self.nodeid,
            "key": self.key,
            "handling": self.handling.value,
            "detail": self.detail,
            "summary": self.summary,
            "repeats": self.repeats,
            "comparison": base64.b64encode(blob).decode("ascii") if blob else None,
            "enforced": self.enforced,
            "profile": base64.b64encode(profile).decode("ascii") if profile else None,
            "profile_error": self.profile_error,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GateResult:
        blob = d.get("comparison")
        profile = d.get("profile")
        return cls(
            nodeid=str(d["nodeid"]),
            key=str(d["key"]),
            handling=Handling(d["handling"]),
            detail=str(d.get("detail", "")),
            summary=d.get("summary"),
            repeats=int(d.get("repeats", 1)),
            comparison=pickle.loads(base64.b64decode(blob)) if blob else None,
            enforced=bool(d.get("enforced", True)),
            profile=pickle.loads(base64.b64decode(profile)) if profile else None,
            profile_error=str(d.get("profile_error", "")),
        )

