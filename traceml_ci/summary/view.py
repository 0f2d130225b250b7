"""One read-side view over a summary dict: typed accessors, so no reader walks raw keys.

Every reader of final_summary.json documents -- the gate's compare and metrics, the traceml-ai
mapping, ``combine``, ``show`` -- reads through :class:`SummaryView` (or :func:`finite` for a
value it already holds). Values that are missing, of the wrong type, or not finite read as
None, so readers never need their own checks. Pure Python and cheap to import: it sits on the
path of ``traceml-ci diff``, whose whole run has a 0.25 s budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from traceml_ci.summary.keys import PHASES, phases_in

__all__ = ["PHASES", "SummaryView", "as_view", "finite", "whole"]


def finite(x: Any) -> float | None:
    """``x`` as a finite float; None for anything else (bool, str, None, NaN, infinity)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _table(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def whole(x: Any) -> int | None:
    """``x`` as a count: an int, never a bool (``true`` is not 1 step)."""
    return x if isinstance(x, int) and not isinstance(x, bool) else None


class SummaryView:
    """Typed, forgiving read access to one summary dict (validated or mapped)."""

    __slots__ = ("doc",)

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.doc = doc

    # -- generic ----------------------------------------------------------------------------
    def at(self, path: Sequence[str]) -> Any:
        """The raw value at a path of keys, or None where the path breaks."""
        node: Any = self.doc
        for key in path:
            if not isinstance(node, Mapping):
                return None
            node = node.get(key)
        return node

    def number(self, path: Sequence[str]) -> float | None:
        """A finite number at ``path``, else None."""
        return finite(self.at(path))

    def text(self, path: Sequence[str]) -> str | None:
        value = self.at(path)
        return value if isinstance(value, str) else None

    # -- sections ---------------------------------------------------------------------------
    @property
    def run(self) -> Mapping[str, Any]:
        return _table(self.doc.get("run"))

    @property
    def env(self) -> Mapping[str, Any]:
        return _table(self.doc.get("env"))

    @property
    def step_time(self) -> Mapping[str, Any]:
        return _table(self.doc.get("step_time"))

    @property
    def step_memory(self) -> Mapping[str, Any]:
        return _table(self.doc.get("step_memory"))

    # -- run --------------------------------------------------------------------------------
    @property
    def run_name(self) -> str:
        name = self.run.get("name")
        return name if isinstance(name, str) else ""

    @property
    def run_status(self) -> str | None:
        status = self.run.get("status")
        return status if isinstance(status, str) else None

    @property
    def efficiency(self) -> Mapping[str, Any]:
        """The ``efficiency`` block (FLOPs per step, achieved TFLOP/s, MFU); empty if absent."""
        return _table(self.doc.get("efficiency"))

    @property
    def counters(self) -> Mapping[str, Any]:
        """The ``counters`` block (one sampled step's scalar reads, optimizer, leak, FLOPs by
        module); empty if absent."""
        return _table(self.doc.get("counters"))

    @property
    def world_size(self) -> int:
        """Ranks in the run: ``distributed.world_size``, else ``run.world_size``, else 1."""
        for path in (("distributed", "world_size"), ("run", "world_size")):
            n = self.number(path)
            if n is not None and n >= 1:
                return int(n)
        return 1

    @property
    def runqueue_wait_pct(self) -> float | None:
        """Measured CPU contention: the main thread's runqueue wait, % of wall time."""
        value = finite(_table(self.run.get("contention")).get("runqueue_wait_pct"))
        return value if value is not None and 0.0 <= value < 100.0 else None

    @property
    def mapped_from(self) -> Mapping[str, Any] | None:
        """What a summary mapped from another tool's says about the mapping, else None."""
        mapped = self.doc.get("mapped_from")
        return mapped if isinstance(mapped, Mapping) else None

    @property
    def repeats_count(self) -> int | None:
        """How many runs a combined summary stands for; None for a single run."""
        return whole(_table(self.doc.get("repeats")).get("count"))

    # -- step time --------------------------------------------------------------------------
    def share(self, phase: str) -> float | None:
        """A phase's share of the step time, in percent."""
        return finite(self.step_time.get(f"{phase}_pct"))

    @property
    def phases(self) -> tuple[str, ...]:
        """The summary's phases, in display order: the five every summary has, with ``wait``
        where the run used a process group (``step_time.wait_pct`` present) and ``h2d`` where
        it copied tensors to a device (``step_time.h2d_pct``)."""
        return phases_in(self.step_time)

    def shares(self) -> dict[str, float | None]:
        """Each of the summary's phases' share (``phases``), in percent."""
        return {p: self.share(p) for p in self.phases}

    def share_noise(self, phase: str) -> float | None:
        """The IQR (pp) of a phase's share across windows of steps; None if not reported."""
        value = self.number(("step_time", "noise", "pct", phase, "iqr"))
        return value if value is None or value >= 0 else None

    def step_ms(self, stat: str = "median") -> float | None:
        """A statistic (``median``, ``p10``, ``p90``, ``mean``) of the step time, in ms."""
        return finite(_table(self.step_time.get("step_ms")).get(stat))

    @property
    def step_noise_ms(self) -> float | None:
        value = self.number(("step_time", "noise", "step_ms", "iqr"))
        return value if value is None or value >= 0 else None

    @property
    def has_noise(self) -> bool:
        return isinstance(self.step_time.get("noise"), Mapping)

    def phase_ms(self, phase: str) -> float | None:
        """A phase's median milliseconds per step."""
        return finite(_table(self.step_time.get("phase_ms")).get(phase))

    @property
    def steps_analyzed(self) -> int | None:
        return whole(self.step_time.get("steps_analyzed"))

    @property
    def steps_total(self) -> int | None:
        return whole(self.step_time.get("steps_total"))

    @property
    def recovered(self) -> bool:
        """The launcher wrote this summary from the killed process's last live snapshot."""
        return self.run.get("recovered_from") == "live_snapshot"

    @property
    def warmup_steps(self) -> int | None:
        return whole(self.step_time.get("warmup_steps"))

    @property
    def clock(self) -> str | None:
        clock = self.step_time.get("clock")
        return clock if isinstance(clock, str) else None

    @property
    def host_clock(self) -> bool:
        """Whether times were taken with the host clock (anything but device events)."""
        return self.clock != "device_event"

    @property
    def steps_per_s(self) -> float | None:
        return finite(_table(self.step_time.get("throughput")).get("steps_per_s"))

    @property
    def samples_per_s(self) -> float | None:
        return finite(_table(self.step_time.get("throughput")).get("samples_per_s"))

    # -- labels, memory, diagnoses ----------------------------------------------------------
    def label(self, area: str) -> str | None:
        """The diagnosis label of ``step_time`` or ``step_memory``."""
        return self.text((area, "diagnosis"))

    def memory_mb(self, key: str) -> float | None:
        """A ``step_memory`` figure in MB (``peak_rss_mb``, ``peak_allocated_mb``, ...)."""
        return finite(self.step_memory.get(key))

    @property
    def memory_device(self) -> str | None:
        device = self.step_memory.get("device")
        return device if isinstance(device, str) else None

    @property
    def growth_mb_per_1k_steps(self) -> float | None:
        return finite(self.step_memory.get("growth_mb_per_1k_steps"))

    @property
    def growth_basis(self) -> str | None:
        basis = self.step_memory.get("growth_basis")
        return basis if isinstance(basis, str) else None

    @property
    def diagnoses(self) -> list[Mapping[str, Any]]:
        found = self.doc.get("diagnoses")
        return [d for d in found if isinstance(d, Mapping)] if isinstance(found, list) else []


#: What a reader of one summary takes: the parsed view, or the dict it is built over.
SummaryLike: TypeAlias = "SummaryView | Mapping[str, Any]"


def as_view(summary: SummaryLike) -> SummaryView:
    """``summary`` itself when it is a view already, else a view over the dict: callers that
    hold a parsed view pass it down instead of having it built again."""
    return summary if isinstance(summary, SummaryView) else SummaryView(summary)


def module_label(row: Mapping[str, Any]) -> str:
    """How a sampled module is named to a person: its path, and its class where the path ends
    in an index (``4 (Linear)`` of a Sequential, ``encoder.layer.3 (BertLayer)``)."""
    name = str(row.get("name", "?"))
    kind = row.get("type")
    if isinstance(kind, str) and kind and name.rsplit(".", 1)[-1].isdigit():
        return f"{name} ({kind})"
    return name


def op_kinds(block: Mapping[str, Any]) -> tuple[dict[str, tuple[int, str]], int]:
    """A kinds block's (``counters.ops``, ``counters.input.fetch`` ...: tracer/counters.py's
    ``kinds_block``) op -> (count, the line that ran the most of it) of the kinds listed, and
    the ops of the kinds not listed."""
    out: dict[str, tuple[int, str]] = {}
    kinds, sites = block.get("kinds"), block.get("sites")
    sites = sites if isinstance(sites, list) else []
    for op, entry in kinds.items() if isinstance(kinds, Mapping) else ():
        if isinstance(entry, list) and len(entry) == 2:
            n, at = finite(entry[0]), finite(entry[1])
            if n is not None:
                i = int(at) if at is not None else -1
                line = sites[i] if 0 <= i < len(sites) else "?"
                out[str(op)] = (int(n), str(line))
    rest = finite(block.get("other"))
    return out, int(rest) if rest is not None else 0


@dataclass(frozen=True)
class KindMove:
    """How one op kind's count moved between two kinds blocks: at least ``low``, at most
    ``high`` (equal where both sides list the kind); ``base`` / ``head``: that side's (count,
    line), None where the kind is among the kinds it does not list."""

    op: str
    low: int
    high: int
    base: tuple[int, str] | None
    head: tuple[int, str] | None

    @property
    def change(self) -> int:
        """The move as one number: the least it rose by, or the least it fell by."""
        return self.low if self.low > 0 else self.high

    @property
    def line(self) -> str:
        """The line of the side that ran more of the kind."""
        entry = self.head if self.change > 0 else self.base
        return entry[1] if entry is not None else "?"

    def said(self) -> str:
        """``+28``, or ``+24 to +28`` where one side counts the kind among those not listed."""
        return f"{self.low:+d}" if self.low == self.high else f"{self.low:+d} to {self.high:+d}"


def op_kind_moves(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[KindMove]:
    """The op kinds of two kinds blocks whose counts surely differ. A block lists its most run
    kinds only, so a kind one side does not list ran there at most as often as its least run
    listed kind (and no more than its ``other``): the move is a range, named where the whole
    range lies on one side of 0."""
    (bk, b_rest), (hk, h_rest) = op_kinds(base), op_kinds(head)

    def bounds(kinds: dict[str, tuple[int, str]], rest: int, op: str) -> tuple[int, int]:
        if op in kinds:
            return kinds[op][0], kinds[op][0]
        return 0, min([rest, *(n for n, _ in kinds.values())]) if rest > 0 else 0

    moves = []
    for op in sorted(set(bk) | set(hk)):
        (b_lo, b_hi), (h_lo, h_hi) = bounds(bk, b_rest, op), bounds(hk, h_rest, op)
        low, high = h_lo - b_hi, h_hi - b_lo
        if low > 0 or high < 0:
            moves.append(KindMove(op, low, high, bk.get(op), hk.get(op)))
    return moves
