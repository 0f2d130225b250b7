"""One A/B round's figures: what one run of a side contributes (read from its summary), and
the pair's per-round differences that gate/ab/sequential.py judges.

Where both runs split their CPU time by contention (``step_time.uncontended``: the windows
where the training thread hardly waited for a CPU; tracer/cputime.py), the load-proof ratios
-- CPU per step and step time without CPU waits -- come from those windows on both sides:
contention slows the CPU time itself, and the CPU reference by another factor. A side with too
few such windows puts both sides back on the whole run's figures: the two sides of a ratio are
always measured the same way.

Pure: no torch, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from traceml_ci.errors import InputError
from traceml_ci.summary.keys import THREAD_SPLIT_KEYS, UNCONTENDED_KEYS
from traceml_ci.summary.view import SummaryView, finite

#: A run's uncontended windows stand for it when they hold at least this many analysed steps
#: and this share of them; fewer are a few lucky windows, not the run.
UNCONTENDED_MIN_STEPS = 20
UNCONTENDED_MIN_SHARE = 0.25


class Side(str, Enum):
    """Which side of an A/B a run measures."""

    BASE = "base"
    HEAD = "head"



def round_order(round_no: int) -> tuple[Side, Side]:
    """Which side runs first in round ``round_no`` (1-based): ABBA -- base, head; head, base; ..."""
    if round_no < 1:
        raise ValueError("rounds count from 1")
    return (Side.BASE, Side.HEAD) if round_no % 2 else (Side.HEAD, Side.BASE)



@dataclass(frozen=True)
class SideFigures:
    """What one run of one side contributes: its median step time (ms) and phase shares (%),
    and the summary they came from (its counters and DataLoader settings; None when the caller
    has only the figures)."""

    step_ms: float
    shares: Mapping[str, float | None]
    summary: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    #: Each phase's median ms per step (None: not reported, an older summary).
    phase_ms: Mapping[str, float | None] | None = field(default=None, compare=False)
    #: The job's CPU ms per step (None: a device-clock run, an older tracer).
    cpu_ms: float | None = None
    #: A fixed workload's CPU ms timed after each step (tracer/cpuref.py; None: not asked
    #: for, an older tracer): how fast the machine's CPU was as this run went.
    cpu_reference_ms: float | None = None
    #: The training thread's step time split (``step_time.thread``: on_cpu_ms, cpu_wait_ms,
    #: blocked_ms; None: no schedstats, a device clock, an older tracer).
    thread: Mapping[str, float] | None = None
    #: ``step_time.uncontended`` where it has enough steps (``UNCONTENDED_MIN_STEPS``,
    #: ``UNCONTENDED_MIN_SHARE``): cpu_ms, on_cpu_ms, blocked_ms, cpu_reference_ms if it ran.
    uncontended: Mapping[str, float] | None = None

    @property
    def cpu_wait_pct(self) -> float | None:
        """The thread's waits for a CPU in % of its step time; None without the split."""
        t = self.thread
        if not t:
            return None
        total = t["on_cpu_ms"] + t["cpu_wait_ms"] + t["blocked_ms"]
        return 100.0 * t["cpu_wait_ms"] / total if total > 0 else None

    @classmethod
    def from_summary(cls, doc: Mapping[str, Any], source: str | None = None) -> SideFigures:
        """Read from a final_summary.json dict; InputError (naming ``source``) when the run
        measured no step time."""
        view = SummaryView(doc)
        step = view.step_ms("median")
        if step is None or step <= 0:
            raise InputError(source, "the run measured no step time (no steps past warmup?)")
        return cls(
            step_ms=step,
            shares=view.shares(),
            summary=doc,
            phase_ms={p: view.phase_ms(p) for p in view.phases},
            cpu_ms=_positive(view.number(("step_time", "cpu_ms"))),
            cpu_reference_ms=_positive(view.number(("step_time", "cpu_reference_ms"))),
            thread=_thread(view),
            uncontended=_uncontended(view),
        )


def _positive(x: float | None) -> float | None:
    return x if x is not None and x > 0 else None


def _thread(view: SummaryView) -> dict[str, float] | None:
    """``step_time.thread`` when it has every part, each a finite number >= 0."""
    parts = {k: view.number(("step_time", "thread", k)) for k in THREAD_SPLIT_KEYS}
    if any(v is None or v < 0 for v in parts.values()):
        return None
    return {k: float(v) for k, v in parts.items() if v is not None}


def uncontended_figures(block: Any, analysed: int | None) -> dict[str, float] | None:
    """A ``step_time.uncontended`` block as a round uses it: None unless it covers enough of
    the run's ``analysed`` steps and every figure is a finite number >= 0 (the CPU
    reference's > 0 where present)."""
    if not isinstance(block, Mapping) or not analysed:
        return None
    steps = finite(block.get("steps"))
    if steps is None or steps < max(UNCONTENDED_MIN_STEPS, UNCONTENDED_MIN_SHARE * analysed):
        return None
    parts = {k: finite(block.get(k)) for k in UNCONTENDED_KEYS}
    if any(v is None or v < 0 for v in parts.values()):
        return None
    out = {k: float(v) for k, v in parts.items() if v is not None}
    ref = _positive(finite(block.get("cpu_reference_ms")))
    if ref is not None:
        out["cpu_reference_ms"] = ref
    return out


def _uncontended(view: SummaryView) -> dict[str, float] | None:
    return uncontended_figures(view.at(("step_time", "uncontended")), view.steps_analyzed)


@dataclass(frozen=True)
class RoundPair:
    """One round: both sides' figures and which ran first."""

    number: int
    base: SideFigures
    head: SideFigures

    @property
    def first(self) -> Side:
        return round_order(self.number)[0]

    @property
    def step_ratio(self) -> float:
        """Head's median step time over base's."""
        return self.head.step_ms / self.base.step_ms

    @property
    def cpu_speed_ratio(self) -> float | None:
        """Head's CPU reference ms over base's, whole runs: how much slower the machine's CPU
        ran for head than for base in this round (a busy neighbour core, another guest on the
        host); None unless both sides timed it."""
        b, h = self.base.cpu_reference_ms, self.head.cpu_reference_ms
        return h / b if b is not None and h is not None and b > 0 and h > 0 else None

    @property
    def uncontended(self) -> bool:
        """Whether the load-proof ratios come from both sides' uncontended windows: both have
        enough of them, and the CPU reference ran in both or in neither."""
        b, h = self.base.uncontended, self.head.uncontended
        return (b is not None and h is not None
                and ("cpu_reference_ms" in b) == ("cpu_reference_ms" in h))

    def load_proof(self, side: SideFigures) -> tuple[float | None, float | None,
                                                      Mapping[str, float] | None]:
        """``side``'s CPU ms, CPU reference ms and thread split, on this pair's one basis
        (its uncontended windows, or its whole run)."""
        q = side.uncontended if self.uncontended else None
        if q is not None:
            return q["cpu_ms"], q.get("cpu_reference_ms"), q
        return side.cpu_ms, side.cpu_reference_ms, side.thread

    @property
    def cpu_ratio(self) -> float | None:
        """Head's CPU ms per step over base's; None when either side lacks it. Where both
        sides timed the CPU reference, each side's CPU is in units of it: the machine's speed
        as that run went (a loaded runner slows CPU time too) divides out."""
        b, rb, _ = self.load_proof(self.base)
        h, rh, _ = self.load_proof(self.head)
        if not (b and h and b > 0 and h > 0):
            return None
        if rb and rh:
            return (h / rh) / (b / rb)
        return h / b

    @property
    def unloaded_ratio(self) -> float | None:
        """Head's step time without CPU waits over base's; None when either side lacks the
        split. Head's CPU part is in base's CPU speed where both sides timed the reference."""
        _, rb, tb = self.load_proof(self.base)
        _, rh, th = self.load_proof(self.head)
        if not tb or not th:
            return None
        b = tb["on_cpu_ms"] + tb["blocked_ms"]
        h = th["on_cpu_ms"] * (rb / rh if rb and rh else 1.0) + th["blocked_ms"]
        return h / b if b > 0 and h > 0 else None

    @property
    def cpu_referenced(self) -> bool:
        """Whether ``cpu_ratio`` is in units of the CPU reference (both sides timed it)."""
        _, rb, _ = self.load_proof(self.base)
        _, rh, _ = self.load_proof(self.head)
        return bool(rb and rh)

    def phase_log_ratio(self, phase: str) -> float | None:
        """log(head's ms / base's ms) of a phase; None when either side lacks a positive time."""
        b = (self.base.phase_ms or {}).get(phase)
        h = (self.head.phase_ms or {}).get(phase)
        if not b or not h or b <= 0 or h <= 0:
            return None
        return math.log(h / b)

    def share_delta_pp(self, phase: str) -> float | None:
        """Head's share of ``phase`` minus base's (pp); a phase one side lacks counts as 0 %
        there; None when neither has it."""
        b, h = self.base.shares.get(phase), self.head.shares.get(phase)
        if b is None and h is None:
            return None
        return (h or 0.0) - (b or 0.0)
