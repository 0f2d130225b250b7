"""One A/B round's figures: what one run of a side contributes (read from its summary), and
the pair's per-round differences that gate/ab/sequential.py judges.

Beside the step-time ratio, a round has the CPU per step's (``step_time.cpu_ms``) and the
step time without CPU waits' (``step_time.thread``): figures a loaded runner moves less, which
a host clock's report shows and its bands judge (docs/gate.md).

Pure: no torch, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from traceml_ci.errors import InputError
from traceml_ci.summary.keys import THREAD_SPLIT_KEYS
from traceml_ci.summary.view import SummaryView


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
    #: The training thread's step time split (``step_time.thread``: on_cpu_ms, cpu_wait_ms,
    #: blocked_ms; None: no schedstats, a device clock, an older tracer).
    thread: Mapping[str, float] | None = None

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
            thread=_thread(view),
        )


def _positive(x: float | None) -> float | None:
    return x if x is not None and x > 0 else None


def _thread(view: SummaryView) -> dict[str, float] | None:
    """``step_time.thread`` when it has every part, each a finite number >= 0."""
    parts = {k: view.number(("step_time", "thread", k)) for k in THREAD_SPLIT_KEYS}
    if any(v is None or v < 0 for v in parts.values()):
        return None
    return {k: float(v) for k, v in parts.items() if v is not None}


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
    def cpu_ratio(self) -> float | None:
        """Head's CPU ms per step over base's; None when either side lacks it."""
        b, h = self.base.cpu_ms, self.head.cpu_ms
        return h / b if b and h else None

    @property
    def unloaded_ratio(self) -> float | None:
        """Head's step time without CPU waits over base's; None when either side lacks the
        split."""
        tb, th = self.base.thread, self.head.thread
        if not tb or not th:
            return None
        b = tb["on_cpu_ms"] + tb["blocked_ms"]
        h = th["on_cpu_ms"] + th["blocked_ms"]
        return h / b if b > 0 and h > 0 else None

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
