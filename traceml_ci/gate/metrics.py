"""The metrics the gate compares: their names, units, which way is worse, and where they live.

Names are dotted paths into final_summary.json (``step_time.dataloader_pct``); tolerance rules
match them with glob patterns. Values are read through summary/view.py's SummaryView.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from traceml_ci.summary.keys import ALL_PHASES
from traceml_ci.summary.view import SummaryLike, as_view


class Kind(str, Enum):
    """How a metric's change is measured and shown."""

    PCT = "pct"  # a share of the step, in percent: delta in percentage points (pp)
    TIME = "time"  # milliseconds: delta relative, in percent
    MEMORY = "memory"  # MiB: delta relative, in percent
    RATE = "rate"  # per second: delta relative, in percent
    SLOPE = "slope"  # MB per 1k steps, may be negative: delta absolute
    LABEL = "label"  # a diagnosis label: changed or not


@dataclass(frozen=True)
class Metric:
    """One comparable figure of a summary.

    ``path``: keys into the summary dict. ``higher_is_worse``: the direction of a regression for
    rules with ``direction = "worse"``. ``env_dependent``: absolute times and memory, only
    comparable between runs on the same kind of machine. ``noise_path``: where the summary
    records this metric's spread across windows of steps (an IQR, in the metric's unit).
    ``timed``: a duration, or a figure made of durations (a share, a rate, a label the shares
    or the ranks' times decide): on a host clock it informs (docs/gate.md, "The rule").
    """

    name: str
    kind: Kind
    path: tuple[str, ...]
    unit: str
    higher_is_worse: bool = True
    env_dependent: bool = False
    noise_path: tuple[str, ...] | None = None
    timed: bool = False

    @property
    def relative(self) -> bool:
        """Whether the headline delta is relative (percent of base) rather than absolute."""
        return self.kind in (Kind.TIME, Kind.MEMORY, Kind.RATE)

    def value(self, summary: SummaryLike) -> Any:
        """This metric's value in ``summary`` (a view, or a dict to view): a finite float, a
        label string, or None."""
        view = as_view(summary)
        return view.text(self.path) if self.kind is Kind.LABEL else view.number(self.path)

    def noise(self, summary: SummaryLike) -> float | None:
        """The IQR across windows of steps that ``summary`` reports for this metric, if any."""
        if self.noise_path is None:
            return None
        value = as_view(summary).number(self.noise_path)
        return None if value is None or value < 0 else value


def _catalogue() -> tuple[Metric, ...]:
    out: list[Metric] = [
        Metric("step_time.diagnosis", Kind.LABEL, ("step_time", "diagnosis"), "", timed=True)
    ]
    # The wait and h2d phases are only in summaries of runs that used a process group / copied
    # to a device: a metric either side has no value for is left out (gate/judging.py), so
    # older baselines still compare.
    for phase in ALL_PHASES:
        out.append(
            Metric(
                f"step_time.{phase}_pct", Kind.PCT, ("step_time", f"{phase}_pct"), "%",
                noise_path=("step_time", "noise", "pct", phase, "iqr"), timed=True,
            )
        )
    out.append(
        Metric(
            "step_time.step_ms.median", Kind.TIME, ("step_time", "step_ms", "median"), "ms",
            env_dependent=True, noise_path=("step_time", "noise", "step_ms", "iqr"), timed=True,
        )
    )
    # The job's CPU time per step (host-clock runs): what a slower code path adds to, and what
    # a busy neighbour moves far less than the wall clock -- the host clock's step-time band
    # judges it (gate/judging.py, HOST_BANDS).
    out.append(
        Metric("step_time.cpu_ms", Kind.TIME, ("step_time", "cpu_ms"), "ms",
               env_dependent=True, timed=True)
    )
    for q in ("p10", "p90"):
        out.append(
            Metric(f"step_time.step_ms.{q}", Kind.TIME, ("step_time", "step_ms", q), "ms",
                   env_dependent=True, timed=True)
        )
    for phase in ALL_PHASES:
        out.append(
            Metric(f"step_time.phase_ms.{phase}", Kind.TIME, ("step_time", "phase_ms", phase),
                   "ms", env_dependent=True, timed=True)
        )
    out.append(
        Metric("step_time.throughput.samples_per_s", Kind.RATE,
               ("step_time", "throughput", "samples_per_s"), "samples/s",
               higher_is_worse=False, env_dependent=True, timed=True)
    )
    out.append(Metric("step_memory.diagnosis", Kind.LABEL, ("step_memory", "diagnosis"), ""))
    for key in ("peak_allocated_mb", "peak_reserved_mb", "peak_rss_mb", "peak_job_rss_mb"):
        out.append(
            Metric(f"step_memory.{key}", Kind.MEMORY, ("step_memory", key), "MB",
                   env_dependent=True)
        )
    out.append(
        Metric("step_memory.growth_mb_per_1k_steps", Kind.SLOPE,
               ("step_memory", "growth_mb_per_1k_steps"), "MB/1k steps", env_dependent=True)
    )
    out.append(
        Metric("gpu.util_mean_pct", Kind.PCT, ("gpu", "util_mean_pct"), "%",
               higher_is_worse=False, env_dependent=True)
    )
    # Compute efficiency (one counted step): informational by default -- the rate divides by
    # host-clock time on CPUs, which a loaded runner stretches; a changed FLOP count means the
    # model (or its input shape) changed.
    out.append(Metric("efficiency.flops_per_step", Kind.RATE, ("efficiency", "flops_per_step"),
                      "FLOP", higher_is_worse=True))
    out.append(Metric("efficiency.achieved_tflops", Kind.RATE,
                      ("efficiency", "achieved_tflops"), "TFLOP/s", higher_is_worse=False,
                      env_dependent=True, timed=True))
    # Distributed runs (summary/ranks.py): the straggler label, and how far the worst rank's
    # own work is above the others' median.
    out.append(Metric("distributed.straggler.label", Kind.LABEL,
                      ("distributed", "straggler", "label"), "", timed=True))
    out.append(Metric("distributed.straggler.score_pct", Kind.PCT,
                      ("distributed", "straggler", "score_pct"), "%", timed=True))
    return tuple(out)


#: Every metric the gate knows, in display order.
METRICS: tuple[Metric, ...] = _catalogue()
METRIC_NAMES: tuple[str, ...] = tuple(m.name for m in METRICS)
BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}

#: Step-time labels that are the healthy outcome: moving *to* one of them is an improvement.
GOOD_STEP_TIME_LABELS = frozenset({"BALANCED", "COMPUTE_BOUND"})
GOOD_MEMORY_LABELS = frozenset({"BALANCED"})
GOOD_RANK_LABELS = frozenset({"RANKS_BALANCED"})
#: Labels that say "too little data to tell": a change to or from them is said, never judged.
UNKNOWN_LABELS = frozenset({"INSUFFICIENT_DATA", "NO_DATA"})


def good_labels(metric: Metric) -> frozenset[str]:
    return {"step_time": GOOD_STEP_TIME_LABELS, "distributed": GOOD_RANK_LABELS}.get(
        metric.path[0], GOOD_MEMORY_LABELS)
