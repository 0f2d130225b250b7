"""Several ranks, one summary: the per-rank table, the job's headline, and stragglers named by
cause (docs/distributed.md).

In data-parallel training every rank waits for the slowest at the gradient all-reduce. Ranks
traced by this version have a **wait phase** (tracer/waits.py): the time each step spent waiting
in collectives, split out of backward, so backward is backward's compute. Then the evidence is
direct: the rank the others wait for is the one that waits least, and its lateness arises in
the phase where its **own work** -- dataloader, forward, backward (compute), optimizer, other --
exceeds the other ranks' median most, backward included. Older summaries have no wait phase:
DDP's all-reduce waits inside their backward, so their own work leaves backward out and the
straggler is the rank whose own work is highest.

Either way a straggler's own work exceeds the median of the other ranks' by more than
``STRAGGLER_MIN_EXCESS_PCT``, by at least ``STRAGGLER_MIN_STEP_PCT`` of the step, by at least
``STRAGGLER_MIN_EXCESS_MS``, and by more than the ranks' own work moves from window to window
within the run (``own_work_noise_ms``); with waits, the others also wait for it at least as
long (``lateness_ms``). CPU contention excuses only what a rank waited for a CPU beyond the
other ranks (ranks sharing cores all wait alike): measured over the analysed steps where the
ranks' summaries say (``step_time.thread.cpu_wait_ms``), what is left of the excess once that
wait is taken off must still pass every threshold above.

The merged summary's step split is one real rank's, never a blend: the critical path's
(``headline_rank``): the straggler, else the rank that waits least, else the one with the most
own work.

Pure data, no torch: the tracer gathers each rank's summary dict, rank 0 calls ``merge_ranks``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from traceml_ci.summary.keys import CONTENDED_RUNQUEUE_WAIT_PCT, H2D_PHASE, WAIT_PHASE
from traceml_ci.summary.thresholds import DEFAULT_THRESHOLDS, Thresholds
from traceml_ci.summary.view import SummaryView, finite

#: A rank whose own work per step is this much above the other ranks' median (percent)
#: straggles.
#: Below it, ranks of one job differ by scheduling noise (on the 2-vCPU development VM,
#: balanced CPU ranks differed by up to 6 %).
STRAGGLER_MIN_EXCESS_PCT = 15.0
#: ... and only when that excess is at least this share of the median step (percent): ranks of
#: a job whose own work is a sliver of the step (the rest is compute waiting at the all-reduce)
#: differ by large fractions of nothing.
STRAGGLER_MIN_STEP_PCT = 5.0
#: ... and only when that excess is at least this many ms per step. On a loaded CPU every rank
#: is preempted now and then for a scheduler time slice (Linux: about 0.75-3 ms), and balanced
#: ranks' own work then differs by a fraction of that: measured on the 2-vCPU VM beside two
#: busy loops, a balanced 2-rank job's ranks did 1.18 and 1.60 ms of own work (+36 %, in every
#: phase alike), read as a straggler by the percentages alone. A rank slowed by a real cause
#: (examples/train_ddp.py: 6 ms more forward, or 48 ms more input wait) is well past it.
STRAGGLER_MIN_EXCESS_MS = 2.0
#: The phases a rank does on its own, without waiting for the others, in a summary without the
#: wait phase (DDP's all-reduce waits inside its backward; see the module docstring).
OWN_WORK_PHASES: tuple[str, ...] = ("dataloader", "forward", "optimizer", "other")
#: ... and in one with it: backward is then backward's compute, its wait split out.
OWN_WORK_PHASES_WITH_WAIT: tuple[str, ...] = (
    "dataloader", "forward", "backward", "optimizer", "other"
)
#: Ranks listed one by one; beyond this the table keeps quantiles (the summary stays small).
MAX_RANKS_LISTED = 64

BALANCED = "RANKS_BALANCED"
INPUT_STRAGGLER = "INPUT_STRAGGLER"
H2D_STRAGGLER = "H2D_STRAGGLER"
COMPUTE_STRAGGLER = "COMPUTE_STRAGGLER"
STRAGGLER = "STRAGGLER"
#: The labels, best first (a label further down is worse).
LABELS: tuple[str, ...] = (BALANCED, STRAGGLER, COMPUTE_STRAGGLER, H2D_STRAGGLER,
                           INPUT_STRAGGLER)

_CAUSE_LABEL = {
    "dataloader": INPUT_STRAGGLER,
    H2D_PHASE: H2D_STRAGGLER,
    "forward": COMPUTE_STRAGGLER,
    "backward": COMPUTE_STRAGGLER,
}
NEXT_STEP: dict[str, str] = {
    BALANCED: "Ranks do the same work per step; nothing to balance.",
    INPUT_STRAGGLER: (
        "Rank {rank} waits longer for its data than the others: look for uneven shards or "
        "sample sizes, a slower disk or data path on its host, fewer DataLoader workers or "
        "CPUs there."
    ),
    H2D_STRAGGLER: (
        "Rank {rank} copies its batches to the device slower than the others: check that its "
        "DataLoader pins memory, its GPU's PCIe link (nvidia-smi -q: link width and "
        "generation) and NUMA placement (the loader's CPUs near its GPU), and whether its "
        "shard has larger batches."
    ),
    COMPUTE_STRAGGLER: (
        "Rank {rank} computes its {cause} slower than the others: a slower or throttled "
        "GPU/host, another job sharing its device, uneven batch shapes, or a hook or extra "
        "work only that rank runs in its {cause}."
    ),
    STRAGGLER: (
        "Rank {rank} spends longer outside forward and backward ({cause}) than the others: "
        "look for per-rank logging, checkpointing or evaluation done on that rank only."
    ),
}


def own_phases_of(waits: bool, copies: bool) -> tuple[str, ...]:
    """The phases a rank does without waiting for the others: backward's compute included
    where the summary has the wait phase, its host-to-device copies where it has the h2d
    phase (a copy waits for no other rank)."""
    phases = OWN_WORK_PHASES_WITH_WAIT if waits else OWN_WORK_PHASES
    return (phases[0], H2D_PHASE, *phases[1:]) if copies else phases


def own_work_phases(view: SummaryView) -> tuple[str, ...]:
    """The phases ``view``'s rank does without waiting for the others (``own_phases_of``)."""
    phases = view.phases
    return own_phases_of(WAIT_PHASE in phases, H2D_PHASE in phases)


def own_work_ms(view: SummaryView) -> float | None:
    """Median ms per step of the phases a rank does without waiting for the others."""
    parts = [view.phase_ms(p) for p in own_work_phases(view)]
    if any(x is None for x in parts):
        return None
    return float(sum(x for x in parts if x is not None))


def own_work_noise_ms(view: SummaryView) -> float | None:
    """How much a rank's own work per step moves within its run, in ms: the sum of the own-work
    phases' share IQRs across windows of steps (``step_time.noise``), at its median step.
    None when the summary has no windows."""
    step = view.step_ms("median")
    iqrs = [view.share_noise(p) for p in own_work_phases(view)]
    if step is None or any(x is None for x in iqrs):
        return None
    return step * sum(x for x in iqrs if x is not None) / 100.0


def _rank_row(doc: Mapping[str, Any]) -> dict[str, Any]:
    v = SummaryView(doc)
    run = v.run
    own = own_work_ms(v)
    noise = own_work_noise_ms(v)
    return {
        "rank": run.get("rank"),
        "local_rank": run.get("local_rank"),
        "node_rank": run.get("node_rank"),
        "host": run.get("host"),
        "status": v.run_status,
        "steps_analyzed": v.steps_analyzed,
        "step_ms_median": v.step_ms("median"),
        "pct": {p: v.share(p) for p in v.phases},
        "phase_ms": {p: v.phase_ms(p) for p in v.phases},
        "wait_ms": v.phase_ms(WAIT_PHASE),
        "own_work_ms": None if own is None else round(own, 4),
        "own_work_noise_ms": None if noise is None else round(noise, 4),
        "runqueue_wait_pct": v.runqueue_wait_pct,
        "cpu_wait_ms": v.number(("step_time", "thread", "cpu_wait_ms")),
        "peak_mb": v.memory_mb("peak_allocated_mb") or v.memory_mb("peak_rss_mb"),
    }


#: Why an FSDP job's ranks are not compared: traced before its collectives were timed as the
#: wait phase (every rank's wait 0), its all-gathers waited inside forward.
FSDP_NOT_ANALYSED = (
    "FSDP: its all-gathers wait inside forward and its reduce-scatters inside "
    "backward, so no phase is a rank's own work; not analysed"
)


def _others_median(others: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """The median of the other ranks' ``key`` where they measured it; None where none did."""
    theirs = [x for x in (finite(r.get(key)) for r in others) if x is not None]
    return statistics.median(theirs) if theirs else None


def _extra_runqueue_wait(
    worst: Mapping[str, Any], others: Sequence[Mapping[str, Any]]
) -> float | None:
    """How much more of its wall time (percentage points) ``worst`` waited for a CPU than the
    other ranks' median; None when its own wait is unknown.

    Judged against the other ranks, not against a quiet machine: ranks that share a loaded host
    (two ranks on two cores, or a busy runner) all wait, and a wait every rank has cannot
    explain why one of them does more own work. A rank whose others did not measure theirs is
    judged on its own wait (the others' counted as none)."""
    wait = finite(worst.get("runqueue_wait_pct"))
    if wait is None:
        return None
    theirs = _others_median(others, "runqueue_wait_pct")
    return wait - (theirs if theirs is not None else 0.0)


def _extra_cpu_wait_ms(
    worst: Mapping[str, Any], others: Sequence[Mapping[str, Any]]
) -> float | None:
    """How many ms per analysed step ``worst``'s training thread waited for a CPU beyond the
    other ranks' median (``cpu_wait_ms``: a mean over its analysed steps, the time between them
    included, not the whole process's life as ``runqueue_wait_pct``); None unless it and some
    other rank measured it. Where it errs (a wait between steps, one long preemption spread
    over all steps) it excuses more, never less: it can miss a small straggler, not name a
    balanced rank.

    Measured beside three busy loops on 2 vCPUs, balanced FSDP ranks: one rank's own work was
    3.3 ms (+63 %) over the other's, and others waited 2.2 ms a step for it -- a straggler by
    every threshold -- while its thread waited 2.2 ms a step more for a CPU; over the whole
    process, 3.6 points more of its wall time, too little for the run-wide figure to say so."""
    mine = finite(worst.get("cpu_wait_ms"))
    theirs = _others_median(others, "cpu_wait_ms")
    if mine is None or theirs is None:
        return None
    return mine - theirs


def _own_work_noise(
    worst: Mapping[str, Any], others: Sequence[Mapping[str, Any]]
) -> float | None:
    """The noise an excess of ``worst``'s own work over the others' median must beat, in ms: its
    own window-to-window spread plus the median of the others' (the difference of two noisy
    medians is as noisy as both); None when ``worst`` has no windows."""
    mine = finite(worst.get("own_work_noise_ms"))
    if mine is None:
        return None
    theirs = _others_median(others, "own_work_noise_ms")
    return mine + (theirs if theirs is not None else 0.0)


def _waits(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every row has the wait phase (ranks traced with it: the evidence is direct)."""
    return bool(rows) and all(finite(r.get("wait_ms")) is not None for r in rows)


def stragglers(rows: Sequence[Mapping[str, Any]], *, fsdp: bool = False) -> dict[str, Any]:
    """The straggler analysis of per-rank rows (``_rank_row``): label, rank, score, cause.

    With the wait phase on every rank (``evidence`` "wait"), the candidate is the rank that
    waited least -- the one the others wait for -- and ``lateness_ms`` how much less it waited
    than the others' median; without it ("own_work"), the rank with the most own work."""
    timed = [r for r in rows if isinstance(r.get("own_work_ms"), (int, float))]
    waits = _waits(timed)
    out: dict[str, Any] = {
        "label": BALANCED,
        "rank": None,
        "score_pct": 0.0,
        "cause": None,
        "threshold_pct": STRAGGLER_MIN_EXCESS_PCT,
        "scores_pct": {},
        "evidence": "wait" if waits else "own_work",
    }
    if fsdp and not _collectives_timed(timed, waits):
        out.update(label=None, not_analysed=FSDP_NOT_ANALYSED)
        return out
    if len(timed) < 2:
        out["label"] = None  # nothing to compare
        return out
    scores = {r["rank"]: _score(r, timed) for r in timed}
    out["scores_pct"] = {str(k): round(s, 2) for k, s in scores.items()}
    worst = _candidate(timed, scores, waits)
    out["score_pct"] = round(scores[worst["rank"]], 2)
    others = [r for r in timed if r is not worst]
    lateness_ms = _lateness_ms(worst, others, waits)
    if lateness_ms is not None:
        out["lateness_ms"] = round(lateness_ms, 3)
    excess = _Excess.of(worst, others, _median_step_ms(timed))
    reasons = _why_no_straggler(worst, others, excess, lateness_ms)
    if reasons is not None:
        out.update(reasons)
        return out
    cause = straggler_cause(worst, others, own_phases_of(waits, _copied(timed)))
    out.update(label=_CAUSE_LABEL.get(cause or "", STRAGGLER), rank=worst["rank"], cause=cause)
    return out


def _collectives_timed(timed: Sequence[Mapping[str, Any]], waits: bool) -> bool:
    """Whether an FSDP job's collectives were timed as the wait phase.

    They are since tracer/waits.py times them; before, they waited inside forward and
    backward -- measured: a slow rank read as balanced, a waiting one as the straggler. An
    FSDP step always gathers, so no wait means untimed."""
    return waits and any(r["wait_ms"] > 0 for r in timed)


def _copied(timed: Sequence[Mapping[str, Any]]) -> bool:
    """Whether copies are a cause: where every rank has the h2d phase (a rank that copied
    nothing has none: its copies are 0 ms, not unknown)."""
    return bool(timed) and any(H2D_PHASE in (r.get("phase_ms") or {}) for r in timed)


def _score(r: Mapping[str, Any], timed: Sequence[Mapping[str, Any]]) -> float:
    """How much more own work (percent) rank row ``r`` does than the other ranks' median; 0
    where theirs is not positive."""
    # Against the median of the *other* ranks: with two ranks, the overall median would sit
    # halfway and halve the straggler's excess.
    others = statistics.median(o["own_work_ms"] for o in timed if o is not r)
    return 100.0 * (r["own_work_ms"] - others) / others if others > 0 else 0.0


def _candidate(
    timed: Sequence[Mapping[str, Any]], scores: Mapping[Any, float], waits: bool
) -> Mapping[str, Any]:
    """The row of the rank that would straggle: with the wait phase, the rank the others wait
    for (of equal waits, the one with more own work); else the one with the highest score."""
    if waits:
        return min(timed, key=lambda r: (r["wait_ms"], -r["own_work_ms"]))
    return max(timed, key=lambda r: scores[r["rank"]])


def _lateness_ms(
    worst: Mapping[str, Any], others: Sequence[Mapping[str, Any]], waits: bool
) -> float | None:
    """How much longer the others waited than ``worst`` did: the time they waited for it. None
    without the wait phase (``waits``)."""
    return statistics.median(r["wait_ms"] for r in others) - worst["wait_ms"] if waits else None


def _median_step_ms(timed: Sequence[Mapping[str, Any]]) -> float:
    """The ranks' median step in ms, of those that report one (0 where none does)."""
    steps = [
        r["step_ms_median"] for r in timed if isinstance(r.get("step_ms_median"), (int, float))
    ]
    return statistics.median(steps) if steps else 0.0


@dataclass(frozen=True)
class _Excess:
    """How much more own work per step a candidate does than the other ranks' median, with
    the figures it is judged against."""

    ms: float  # the candidate's own work less the others' median
    others_ms: float  # the other ranks' median own work
    step_ms: float  # the ranks' median step
    noise_ms: float | None  # what an excess must beat (``_own_work_noise``); None: unknown

    @classmethod
    def of(
        cls, worst: Mapping[str, Any], others: Sequence[Mapping[str, Any]], step_ms: float
    ) -> _Excess:
        """``worst``'s excess over ``others``, in a job whose median step is ``step_ms``."""
        others_ms = statistics.median(r["own_work_ms"] for r in others)
        return cls(
            ms=worst["own_work_ms"] - others_ms,
            others_ms=others_ms,
            step_ms=step_ms,
            noise_ms=_own_work_noise(worst, others),
        )

    @property
    def floor_ms(self) -> float:
        """The least excess that straggles, in ms: ``STRAGGLER_MIN_STEP_PCT`` of the median step,
        and at least ``STRAGGLER_MIN_EXCESS_MS``."""
        return max(STRAGGLER_MIN_STEP_PCT / 100.0 * self.step_ms, STRAGGLER_MIN_EXCESS_MS)

    def small(self, ms: float) -> bool:
        """An excess of ``ms`` over the others' own work is below the thresholds."""
        return (
            self.others_ms <= 0
            or 100.0 * ms / self.others_ms <= STRAGGLER_MIN_EXCESS_PCT
            or ms < self.floor_ms
        )

    def within_noise(self, ms: float) -> bool:
        """An excess of ``ms`` is no more than the ranks' own work moves between windows."""
        return self.noise_ms is not None and ms <= self.noise_ms


def _why_no_straggler(
    worst: Mapping[str, Any],
    others: Sequence[Mapping[str, Any]],
    excess: _Excess,
    lateness_ms: float | None,
) -> dict[str, str] | None:
    """Why the candidate ``worst`` is no straggler, as what the analysis adds to say so: nothing
    where its excess (or the others' wait for it) is below the thresholds, ``noisy`` or
    ``contended`` where noise or CPU contention explains it. None where it straggles."""
    if excess.small(excess.ms) or (lateness_ms is not None and lateness_ms < excess.floor_ms):
        return {}
    if excess.within_noise(excess.ms):
        return {"noisy": (
            f"rank {worst['rank']}'s extra own work ({excess.ms:.1f} ms) is within how much "
            f"the ranks' own work moves between windows of the run ({excess.noise_ms:.1f} ms)"
        )}
    contended = _contention_excuse(worst, others, excess)
    return None if contended is None else {"contended": contended}


def _contention_excuse(
    worst: Mapping[str, Any], others: Sequence[Mapping[str, Any]], excess: _Excess
) -> str | None:
    """How waiting for a CPU beyond the other ranks explains ``worst``'s excess; None where it
    does not. Judged by its thread's waits in its steps where it and another rank measured
    them, else by its run-wide runqueue wait."""
    extra_cpu_wait_ms = _extra_cpu_wait_ms(worst, others)
    if extra_cpu_wait_ms is not None:
        # Its thread waited that much longer for a CPU in the steps measured: what is left
        # of the excess must still straggle. A larger excess is still a straggler.
        left_ms = excess.ms - max(extra_cpu_wait_ms, 0.0)
        if excess.small(left_ms) or excess.within_noise(left_ms):
            return (
                f"rank {worst['rank']}'s extra own work ({excess.ms:.1f} ms) less its extra "
                f"waits for a CPU ({extra_cpu_wait_ms:.1f} ms per step more than the other "
                f"ranks') leaves {max(left_ms, 0.0):.1f} ms, within what balanced ranks "
                "differ by"
            )
        return None
    # Only the run-wide wait known (the straggler's or every other rank's per-step figure
    # missing): waiting a further fraction w of its wall time lost it up to w of each step.
    # With the per-step figure this is not consulted: the run-wide one counts the process's
    # startup too, and excused a straggler whose steps waited no more than the others'.
    extra_wait = _extra_runqueue_wait(worst, others)
    if (
        extra_wait is not None
        and extra_wait >= CONTENDED_RUNQUEUE_WAIT_PCT
        and excess.ms <= extra_wait / 100.0 * excess.step_ms
    ):
        return (
            f"rank {worst['rank']}'s extra own work ({excess.ms:.1f} ms) is "
            f"within what its extra CPU contention ({extra_wait:.0f} % more "
            "runqueue wait than the other ranks') can cause"
        )
    return None


def phase_excess_ms(
    worst: Mapping[str, Any], others: Sequence[Mapping[str, Any]], phase: str
) -> float | None:
    """How many ms per step ``worst`` spends in ``phase`` beyond the other ranks' median;
    None where a rank's time in it is unknown."""
    mine = _phase_ms(worst, phase)
    values = [_phase_ms(r, phase) for r in others]
    if mine is None or not values or any(x is None for x in values):
        return None
    return mine - statistics.median(x for x in values if x is not None)


def straggler_cause(
    worst: Mapping[str, Any], others: Sequence[Mapping[str, Any]], phases: Sequence[str]
) -> str | None:
    """The own-work phase where ``worst`` exceeds the other ranks' median most."""
    excess = {p: phase_excess_ms(worst, others, p) for p in phases}
    known = {p: x for p, x in excess.items() if x is not None}
    return max(known, key=lambda p: known[p]) if known else None


def _phase_ms(row: Mapping[str, Any], phase: str) -> float | None:
    """A rank's median ms in ``phase``; a rank without the h2d phase copied nothing (0 ms)."""
    ms = row.get("phase_ms") or {}
    if phase == H2D_PHASE and phase not in ms:
        return 0.0
    return finite(ms.get(phase))


def headline_rank(rows: Sequence[Mapping[str, Any]], analysis: Mapping[str, Any]) -> Any:
    """The rank whose step split heads the merged summary -- the critical path's: the
    straggler; else, where ranks have the wait phase, the one that waited least (the others
    waited for it); else the one with the most own work. None when no rank was timed."""
    if isinstance(analysis.get("rank"), int):
        return analysis["rank"]
    timed = [r for r in rows if isinstance(r.get("own_work_ms"), (int, float))]
    if not timed:
        return None
    if _waits(timed):
        return min(timed, key=lambda r: (r["wait_ms"], -r["own_work_ms"]))["rank"]
    return max(timed, key=lambda r: r["own_work_ms"])["rank"]


def transfer_ms(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The collectives' own time per step, waiting for no one: the least any rank waited (the
    rank that arrives last at a collective finds the others there, so its wait is the
    transfer). None without the wait phase on every rank, or with one rank.

    An estimate from per-rank medians, for every backend alike (no device events, no sync):
    where ranks take turns arriving last, each rank's median holds some waiting, and part of
    the waiting reads as transfer."""
    timed = [r for r in rows if finite(r.get("wait_ms")) is not None]
    if len(timed) < 2 or len(timed) != len(rows):
        return None
    return min(float(r["wait_ms"]) for r in timed)


def split_waits(rows: Sequence[dict[str, Any]]) -> None:
    """Each row's ``waiting_ms``: its wait beyond the collectives' own time (``transfer_ms``),
    i.e. the time it waited for the other ranks (rows unchanged where that time is unknown)."""
    transfer = transfer_ms(rows)
    if transfer is not None:
        for r in rows:
            r["waiting_ms"] = round(float(r["wait_ms"]) - transfer, 4)


def analyse(
    docs: Sequence[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], dict[str, Any], Any]:
    """Ranks' summaries compared: their per-rank rows (by rank), the straggler analysis
    (``stragglers``) and the headline rank (``headline_rank``). What ``merge_ranks`` puts in
    the merged summary, and what the live view labels ranks by from their windows' summaries
    (cli/live_view.py): one rule for both."""
    rows = sorted(
        (_rank_row(d) for d in docs),
        key=lambda r: r["rank"] if isinstance(r["rank"], int) else 1 << 30,
    )
    split_waits(rows)
    fsdp = any((SummaryView(d).run.get("parallelism") == "fsdp") for d in docs)
    analysis = stragglers(rows, fsdp=fsdp)
    return rows, analysis, headline_rank(rows, analysis)


def _quantiles(rows: Sequence[Mapping[str, Any]], key: str) -> dict[str, float] | None:
    values = sorted(r[key] for r in rows if isinstance(r.get(key), (int, float)))
    if not values:
        return None
    qs = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else values * 9
    return {
        "min": values[0],
        "p10": qs[0],
        "median": statistics.median(values),
        "p90": qs[-1],
        "max": values[-1],
    }


def merge_ranks(
    docs: Sequence[Mapping[str, Any]],
    *,
    world_size: int,
    nodes: int | None = None,
    backend: str | None = None,
    failed: Sequence[int] = (),
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> dict[str, Any]:
    """One summary for a distributed job from its ranks' summaries (rank 0's first).

    The result is rank 0's summary with: the ``step_time`` block and step-time diagnoses of one
    real rank, the critical path's (``headline_rank``: the rank the others wait for, whose
    split is the job's; the others' waits are in the per-rank table), and a ``distributed``
    block (world size, nodes, backend, the per-rank table, the straggler analysis, which rank
    heads the summary). ``failed``: ranks that did not report (the run's status is then
    ``crashed`` unless it was already worse)."""
    import copy

    if not docs:
        raise ValueError("no rank summaries to merge")
    out = copy.deepcopy(dict(docs[0]))
    rows, analysis, head = analyse(docs)
    source = next((d for d in docs if SummaryView(d).run.get("rank") == head), docs[0])
    diagnoses = [d for d in out.get("diagnoses") or [] if d.get("area") != "step_time"]
    if source is not docs[0] and isinstance(source.get("step_time"), Mapping):
        out["step_time"] = copy.deepcopy(dict(source["step_time"]))
    found = [d for d in SummaryView(source).diagnoses if d.get("area") == "step_time"]
    diagnoses = [copy.deepcopy(dict(d)) for d in found] + diagnoses
    if analysis["label"] is not None:
        diagnoses.append(_straggler_diagnosis(analysis))
    imbalance = memory_imbalance(docs, thresholds)
    if imbalance is not None:
        diagnoses.append(imbalance)
    out["diagnoses"] = diagnoses
    statuses = {r["status"] for r in rows}
    run = out.setdefault("run", {})
    run["world_size"] = world_size
    if run.get("status") == "completed" and (failed or "crashed" in statuses):
        run["status"] = "crashed"  # one rank down: the job did not complete
    listed = rows[:MAX_RANKS_LISTED]
    out["distributed"] = {
        "world_size": world_size,
        "nodes": nodes,
        "backend": backend,
        "ranks_reported": len(rows),
        "failed_ranks": sorted(int(r) for r in failed),
        "ranks": listed,
        "ranks_not_listed": len(rows) - len(listed),
        "quantiles": (
            {k: _quantiles(rows, k) for k in ("step_ms_median", "own_work_ms")}
            if len(rows) > MAX_RANKS_LISTED
            else None
        ),
        "straggler": analysis,
        "headline_rank": head,
    }
    transfer = transfer_ms(rows)
    if transfer is not None:
        out["distributed"]["transfer_ms"] = round(transfer, 4)
    return out


RANK_GPU_MEMORY_IMBALANCE = "RANK_GPU_MEMORY_IMBALANCE"


def memory_imbalance(
    docs: Sequence[Mapping[str, Any]], th: Thresholds = DEFAULT_THRESHOLDS
) -> dict[str, Any] | None:
    """RANK_GPU_MEMORY_IMBALANCE where the ranks' peak GPU memory (allocated) differs by at
    least ``rank_memory_imbalance_fraction`` of the highest and ``rank_memory_imbalance_min_mb``
    (thresholds.py); None when balanced, or fewer than two ranks report a GPU peak."""
    peaks = []
    for d in docs:
        v = SummaryView(d)
        mb = finite(v.memory_mb("peak_allocated_mb"))
        if mb is not None:
            peaks.append((mb, v.run.get("rank")))
    if len(peaks) < 2:
        return None
    high, high_rank = max(peaks, key=lambda p: p[0])
    low, low_rank = min(peaks, key=lambda p: p[0])
    gap = high - low
    if gap < th.rank_memory_imbalance_min_mb or gap < th.rank_memory_imbalance_fraction * high:
        return None
    return {
        "area": "distributed",
        "kind": RANK_GPU_MEMORY_IMBALANCE,
        "severity": "warn",
        "message": (
            f"Rank {high_rank} peaked at {high:.0f} MB of GPU memory, rank {low_rank} at "
            f"{low:.0f} MB ({100 * gap / high:.0f}% less; threshold "
            f"{100 * th.rank_memory_imbalance_fraction:g}% and "
            f"{th.rank_memory_imbalance_min_mb:g} MB)."
        ),
        "next_step": (
            f"Ranks of a data-parallel job should hold the same memory: look for work only rank "
            f"{high_rank} does (metrics or outputs kept on the GPU, a checkpoint or evaluation "
            "gathered to it), uneven batch shapes between ranks, or a leak on that rank; the "
            "per-rank peaks are in `traceml-ci show`."
        ),
    }


def _straggler_diagnosis(a: Mapping[str, Any]) -> dict[str, Any]:
    label = a["label"]
    if label == BALANCED:
        message = (
            f"No rank's own work per step is more than {a['threshold_pct']:g}% above the "
            f"other ranks' median (largest: {a['score_pct']:+.1f}%)."
        )
        severity = "info"
    else:
        lateness = a.get("lateness_ms")
        waited = (
            f"the other ranks wait {lateness:.1f} ms per step for it in collectives (their "
            "wait phase)"
            if isinstance(lateness, (int, float))
            else "the others wait for it inside backward (the gradient all-reduce)"
        )
        message = (
            f"Rank {a['rank']} does {a['score_pct']:.0f}% more own work per step than the "
            f"other ranks' median, most of it in {a['cause']}; {waited}."
        )
        severity = "warn"
    return {
        "area": "distributed",
        "kind": label,
        "severity": severity,
        "message": message,
        "next_step": NEXT_STEP[label].format(rank=a.get("rank"), cause=a.get("cause")),
    }
