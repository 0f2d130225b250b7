"""Repeated runs of one job, combined into one summary whose noise includes the runs' spread.

On a shared CI runner the phase shares of two identical runs can differ by several percentage
points (e.g. the compute phases run 25 % slower in one process than in the next), while each
run's own windows of steps agree to a fraction of a point. A gate fed single runs therefore has
to choose between missing real shifts and crying wolf. Like asv, which times several processes,
the remedy is repetition: the combined summary takes each share's mean over the runs (its spread
shrinks with the square root of their number) and reports that spread as its noise, so the gate's
noise rule sees it. One runner hiccup among three runs moves the mean, but it widens the noise
more: alone it makes a warning, not a regression. (The mean, not the median: on the development
VM, whose runs fall into a fast and a slow mode, three runs a side caught a +8 pp shift 99.4 % of
the time with means and 91 % with medians, with no false alarms either way.)

The result is an ordinary final_summary.json (it validates), built on the median run -- the
one whose median step time is the median -- with these fields replaced:

- ``step_time.<phase>_pct``: the mean over the runs (the five still add up to 100);
- ``step_time.noise.pct.<phase>``: median = that share, iqr = the larger of ``IQR_PER_SD`` x
  the standard error of the mean across runs and the runs' median window IQR;
- ``step_time.step_ms`` and ``phase_ms``: the median over the runs of each figure, and
  ``noise.step_ms`` likewise;
- ``repeats``: ``{"count": n, "runs": [run names], "step_time": [each run's step_time]}``.

A combined summary can be combined again: its runs are taken apart first (from
``repeats.step_time``), so three runs combined, plus one more, make a summary of four runs, not
of two.

Labels and diagnoses are those of the median run: a label is a threshold on the shares, and the
gate judges the shares themselves.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from traceml_ci.summary.keys import LEGACY_STEP_TIME_KEYS
from traceml_ci.summary.view import SummaryView

#: Interquartile range of a normal distribution, in standard deviations: turns the standard
#: error across runs into the unit of the per-window IQRs it is compared and combined with.
IQR_PER_SD = 1.349


def runs_of(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The single runs a summary stands for: itself, or a combined summary's runs taken apart
    (each with its own name and step_time, the rest shared). ValueError for a combined summary
    that does not carry its runs' step times (written before they were kept)."""
    repeats = doc.get("repeats")
    if not isinstance(repeats, Mapping):
        return [doc]
    names, step_times = repeats.get("runs") or [], repeats.get("step_time")
    if not isinstance(step_times, list) or len(step_times) != repeats.get("count"):
        raise ValueError("combines runs it does not keep apart (an older traceml-ci wrote it): "
                         "combine its original runs instead")
    base = {k: v for k, v in doc.items() if k != "repeats"}
    return [
        {**base, "run": {**(doc.get("run") or {}), "name": names[i] if i < len(names) else ""},
         "step_time": step_time}
        for i, step_time in enumerate(step_times)
    ]


#: The memory peaks of ``step_memory`` that a combination takes the largest of.
PEAK_MEMORY_KEYS = ("peak_allocated_mb", "peak_reserved_mb", "peak_rss_mb", "peak_job_rss_mb")


def combine_repeats(docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One summary for repeated runs of the same job (schema-valid summaries, at least one).
    Combined summaries among ``docs`` count as the runs they combine."""
    if not docs:
        raise ValueError("no summaries to combine")
    docs = [run for doc in docs for run in runs_of(doc)]
    views = [SummaryView(d) for d in docs]
    out = copy.deepcopy(dict(docs[_median_run(views)]))
    if len(docs) == 1:
        return out
    st = out["step_time"]
    phases = SummaryView(out).phases  # with the wait phase where the runs used a process group
    _mean_shares(st, views, phases)
    _median_step_ms(st, views)
    _median_phase_ms(st, views)
    _median_cpu(st, views)
    _put(st, "thread", _median_thread(views))
    for legacy in LEGACY_STEP_TIME_KEYS:  # one run's figure would stand for all of them
        st.pop(legacy, None)
    _largest_memory_peaks(out.get("step_memory"), views)
    _median_step_noise(st, views)
    _most_contention(out, views)
    out["repeats"] = {
        "count": len(docs),
        "runs": [v.run_name for v in views],
        # so that it can be combined again
        "step_time": [copy.deepcopy(d["step_time"]) for d in docs],
    }
    return out


def _median_run(views: Sequence[SummaryView]) -> int:
    """The index of the run whose median step time is the median (the lower of the middle two
    for an even count); runs without one sort last, ties in their order."""
    medians = [v.step_ms("median") for v in views]
    order = sorted(range(len(views)), key=lambda i: (medians[i] is None, medians[i] or 0.0, i))
    return order[(len(views) - 1) // 2]


def _put(table: dict[str, Any], key: str, value: Any) -> None:
    """``table[key] = value``, or no ``key`` where ``value`` is None (not every run has it)."""
    if value is None:
        table.pop(key, None)
    else:
        table[key] = value


def _mean_shares(
    st: dict[str, Any], views: Sequence[SummaryView], phases: Sequence[str]
) -> None:
    """Each phase's share in ``st``: the mean over the runs, rescaled to add up to 100, with
    the runs' spread (or their typical window IQR, if larger) as its noise. Unchanged unless
    every run has every share."""
    shares = [v.shares() for v in views]
    if not all(s.get(p) is not None for s in shares for p in phases):
        return
    pct_noise = (st.get("noise") or {}).get("pct") or {}
    values = {p: [float(s[p]) for s in shares] for p in phases}  # type: ignore[arg-type]
    centers = {p: statistics.fmean(v) for p, v in values.items()}
    total = sum(centers.values()) or 1.0  # 100 up to rounding: rescale the rest away
    for p in phases:
        share = round(centers[p] * 100.0 / total, 2)
        st[f"{p}_pct"] = share
        iqr = _iqr_across_runs(values[p], [v.share_noise(p) for v in views])
        if p in pct_noise:
            pct_noise[p] = {"median": share, "iqr": round(iqr, 3)}


def _median_step_ms(st: dict[str, Any], views: Sequence[SummaryView]) -> None:
    """``st``'s step time statistics: each the median over the runs that report it (left as it
    is where none does)."""
    for key in ("median", "p10", "p90", "mean"):
        found = [x for x in (v.step_ms(key) for v in views) if x is not None]
        if found and st.get("step_ms"):
            st["step_ms"][key] = round(statistics.median(found), 4)


def _median_phase_ms(st: dict[str, Any], views: Sequence[SummaryView]) -> None:
    """``st``'s phase times: each the median over the runs that report it (left as it is where
    none does)."""
    for p in (st.get("phase_ms") or {}):
        found = [x for x in (v.phase_ms(p) for v in views) if x is not None]
        if found:
            st["phase_ms"][p] = round(statistics.median(found), 4)


def _median_cpu(st: dict[str, Any], views: Sequence[SummaryView]) -> None:
    """CPU per step in ``st``: the runs' median where every run has it; a mix is no figure at
    all."""
    cpus = [v.number(("step_time", "cpu_ms")) for v in views]
    known = [c for c in cpus if c is not None]
    _put(st, "cpu_ms", round(statistics.median(known), 4) if len(known) == len(cpus) else None)


def _median_thread(views: Sequence[SummaryView]) -> dict[str, Any] | None:
    """The training thread's figures: each the runs' median, of those every run has; None
    unless every run has the block."""
    threads = [v.at(("step_time", "thread")) for v in views]
    if not all(isinstance(t, dict) for t in threads):
        return None
    return {k: round(statistics.median(t[k] for t in threads), 4)
            for k in threads[0] if all(k in t for t in threads)}


def _largest_memory_peaks(mem: Any, views: Sequence[SummaryView]) -> None:
    """The memory peaks ``mem`` has: each the largest run's. Several runs in one process (the
    pytest plugin's repeats and re-runs) reuse what the first one allocated, so only the first
    shows the job's own memory; a median would compare a warm re-run with a cold run on the
    other side."""
    if not isinstance(mem, dict):
        return
    for key in PEAK_MEMORY_KEYS:
        found = [x for x in (v.memory_mb(key) for v in views) if x is not None]
        if found and key in mem:
            mem[key] = max(found)


def _median_step_noise(st: dict[str, Any], views: Sequence[SummaryView]) -> None:
    """The step time's noise in ``st``: the runs' median step, with the spread across runs (or
    their typical window IQR, if larger) as its IQR; unchanged unless every run has a median
    step."""
    step_noise = (st.get("noise") or {}).get("step_ms")
    medians = [v.step_ms("median") for v in views]
    if not step_noise or any(m is None for m in medians):
        return
    known = [m for m in medians if m is not None]
    step_noise["median"] = round(statistics.median(known), 4)
    step_noise["iqr"] = round(_iqr_across_runs(known, [v.step_noise_ms for v in views]), 4)


def _most_contention(out: dict[str, Any], views: Sequence[SummaryView]) -> None:
    """``out``'s CPU contention: the most any run waited for a CPU -- the combined shares carry
    every run's load, and the gate's contention guard reads this figure (a baseline keeps its
    own)."""
    waits = [w for w in (v.runqueue_wait_pct for v in views) if w is not None]
    contention = (out.get("run") or {}).get("contention")
    if waits and isinstance(contention, dict):
        contention["runqueue_wait_pct"] = max(waits)


def _iqr_across_runs(values: Sequence[float], window_iqrs: Sequence[float | None]) -> float:
    """The noise of the mean of ``values`` (one a run), as an IQR: ``IQR_PER_SD`` x its standard
    error, or the runs' typical window IQR where that is larger."""
    spread = IQR_PER_SD * statistics.stdev(values) / len(values) ** 0.5
    return max(spread, _median(window_iqrs))


def _median(iqrs: Sequence[float | None]) -> float:
    """The runs' typical window IQR for one figure (0 when none reports it): a floor under the
    spread across runs, which two or three runs can underestimate by chance."""
    found = [x for x in iqrs if x is not None]
    return statistics.median(found) if found else 0.0
