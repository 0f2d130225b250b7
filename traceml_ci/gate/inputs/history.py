"""Many summaries over time: a pandas DataFrame per series, each metric's trend, and the run at
which it moved (the best single-step split of the series, when its shift of medians is beyond
the metric's fail tolerance).

pandas is imported inside the functions that need it; nothing else in the gate imports this.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceml_ci.errors import InputError
from traceml_ci.fsutil import is_dir, is_file, missing
from traceml_ci.gate import fmt
from traceml_ci.gate.metrics import METRICS, Kind, Metric
from traceml_ci.gate.rules import DEFAULT_RULES, Rules
from traceml_ci.summary.store import RunPoint

SPARK = "▁▂▃▄▅▆▇█"
#: The metrics a history shows: every gated one with a number or a label.
HISTORY_METRICS: tuple[Metric, ...] = tuple(
    m for m in METRICS
    if m.kind is Kind.LABEL or m.name in (
        "step_time.step_ms.median", "step_time.throughput.samples_per_s",
        "step_memory.peak_allocated_mb", "step_memory.peak_reserved_mb",
        "step_memory.peak_rss_mb",
    ) or (m.kind is Kind.PCT and m.name.startswith("step_time."))
)


@dataclass(frozen=True)
class Move:
    """Where a metric moved: the first run after the split, and the medians either side."""

    at: str
    before: float | str
    after: float | str
    delta: float | None  # pp for *_pct, percent for relative metrics, None for labels


def label_for(path: Path) -> str:
    """How a history names a run read from ``path``: its folder for ``final_summary.json``,
    else the file's stem."""
    if path.stem == "final_summary":
        return path.parent.name or path.stem
    return path.stem


def collect(paths: Iterable[str | os.PathLike[str]]) -> list[RunPoint]:
    """Load summaries from files and folders (folders: every ``*.json`` below them that is a
    summary or a baseline set; other JSON there is skipped). Sorted by series, then run start.
    A file named explicitly must be readable and valid: InputError otherwise."""
    from traceml_ci.gate.inputs.files import InputKind, read_input

    points: list[RunPoint] = []
    for raw in paths:
        path = Path(raw)
        if is_dir(path):
            files = sorted(p for p in path.rglob("*.json") if is_file(p))
            explicit = False
        elif missing(path):
            raise InputError(str(path), "no such file or folder")
        else:  # a file, or what cannot be looked at: reading it says why
            files, explicit = [path], True
        for file in files:
            try:
                loaded = read_input(file)
            except InputError:
                if explicit:
                    raise
                continue
            label = label_for(file)
            for key, summary in loaded.summaries.items():
                run = summary.get("run") or {}
                series = key if loaded.kind is InputKind.SET else str(run.get("name") or "")
                points.append(RunPoint(series, label, str(run.get("started_at") or ""),
                                       str(file), summary))
    if not points:
        raise InputError(None, "no summaries found in " + ", ".join(map(str, paths)))
    return sort_points(points)


def sort_points(points: Iterable[RunPoint]) -> list[RunPoint]:
    """Points in history order: by series, then run start (then source, for equal starts)."""
    return sorted(points, key=lambda p: (p.series, p.started_at, p.path))


def collect_db(db: str | os.PathLike[str], *, name: str | None = None,
               branch: str | None = None, last: int | None = None) -> list[RunPoint]:
    """The runs recorded in a history database (``traceml-ci record``), as :func:`collect`
    gives them for files: ``name`` keeps one series, ``branch`` one branch, ``last`` the newest
    N runs. Each stored summary is validated again (the file could have been edited)."""
    from traceml_ci.gate.inputs.files import check_summary
    from traceml_ci.summary.store import HistoryStore

    with HistoryStore(db, create=False) as store:
        rows = store.runs(name=name, branch=branch, last=last)
    points = []
    for row in rows:
        summary, _ = check_summary(row.summary, str(db), f"run {row.id}")
        points.append(RunPoint(row.name, row.label, row.started_at, row.source, summary))
    if not points:
        which = [f"{k} {v!r}" for k, v in (("name", name), ("branch", branch)) if v is not None]
        raise InputError(str(db), "no runs recorded" + (" for " + ", ".join(which)
                                                        if which else ""))
    return sort_points(points)


def frame(points: Sequence[RunPoint]) -> Any:
    """A pandas DataFrame: one row per run (series, run, started_at, path), one column per
    metric of :data:`HISTORY_METRICS`."""
    import pandas as pd

    rows = []
    for p in points:
        row: dict[str, Any] = {"series": p.series, "run": p.label, "started_at": p.started_at,
                               "path": p.path}
        for m in HISTORY_METRICS:
            row[m.name] = m.value(p.summary)
        rows.append(row)
    columns = ["series", "run", "started_at", "path", *(m.name for m in HISTORY_METRICS)]
    return pd.DataFrame(rows, columns=columns)


#: Runs in the rolling median the history shows beside the last value (the series' level now,
#: steadier than its last run).
ROLLING_RUNS = 5


def rolling_median(values: Sequence[Any], runs: int = ROLLING_RUNS) -> float | None:
    """The median of the last ``runs`` values present (pandas' rolling median, last row)."""
    import pandas as pd

    series = pd.Series([float(v) for v in values if isinstance(v, (int, float)) and v == v],
                       dtype="float64")
    if series.empty:
        return None
    return float(series.rolling(runs, min_periods=1).median().iloc[-1])


def find_move(values: Sequence[Any], runs: Sequence[str], metric: Metric,
              rules: Rules = DEFAULT_RULES) -> Move | None:
    """The best single-step split of the series (least absolute deviation from the medians
    either side), if its shift of medians is beyond the metric's fail tolerance (either
    direction); for labels, the last run whose label differs from the one before it."""
    pairs = [(v, r) for v, r in zip(values, runs, strict=True) if v is not None and v == v]
    if len(pairs) < 2:
        return None
    if metric.kind is Kind.LABEL:
        for i in range(len(pairs) - 1, 0, -1):
            if pairs[i][0] != pairs[i - 1][0]:
                return Move(pairs[i][1], pairs[i - 1][0], pairs[i][0], None)
        return None
    rule = rules.rule_for(metric.name)
    if not rule.has_fail_tier:
        return None
    vals = [float(v) for v, _ in pairs]
    best: tuple[float, int, float, float] | None = None
    for k in range(1, len(vals)):
        before, after = statistics.median(vals[:k]), statistics.median(vals[k:])
        # L1 cost of a single step at k: the split that best explains the series
        cost = sum(abs(v - before) for v in vals[:k]) + sum(abs(v - after) for v in vals[k:])
        if best is None or cost < best[0]:
            best = (cost, k, before, after)
    assert best is not None
    _, k, before, after = best
    d = after - before
    rel = d / abs(before) * 100.0 if before else (0.0 if d == 0 else float("inf"))
    beyond = (rule.abs is None or abs(d) > rule.abs) and (rule.rel is None or abs(rel) > rule.rel)
    if not beyond:
        return None
    delta = (rel if rel != float("inf") else None) if metric.relative else d
    return Move(pairs[k][1], before, after, delta)


def sparkline(values: Sequence[Any]) -> str:
    """One block character per value, scaled between the series' min and max ('·' for none)."""
    nums = [float(v) for v in values if isinstance(v, (int, float)) and v == v]
    if not nums:
        return ""
    lo, hi = min(nums), max(nums)
    out = []
    for v in values:
        if not isinstance(v, (int, float)) or v != v:
            out.append("·")
        elif hi == lo:
            out.append(SPARK[0])
        else:
            out.append(SPARK[round((float(v) - lo) / (hi - lo) * (len(SPARK) - 1))])
    return "".join(out)


def render_history(points: Sequence[RunPoint], rules: Rules = DEFAULT_RULES, *,
                   output: str = "markdown") -> str:
    """``output``: "markdown" (a trend table per series) or "csv" (one row per run)."""
    df = frame(points)
    if output == "csv":  # CSV goes to a terminal or a CI log: escaped like any text output
        df = df.map(lambda x: fmt.plain(x) if isinstance(x, str) else x)
        return str(df.to_csv(index=False))
    return _markdown(df, rules)


def _markdown(df: Any, rules: Rules) -> str:
    from tabulate import tabulate


    out: list[str] = []
    for series, group in df.groupby("series", sort=True):
        runs = list(group["run"])
        title = fmt.markdown(series or "(unnamed run)")
        span = f"{len(runs)} run{'s' if len(runs) != 1 else ''}"
        first, last = group["started_at"].iloc[0], group["started_at"].iloc[-1]
        if first and last:
            span += f", {fmt.markdown(first)} → {fmt.markdown(last)}"
        out += [f"### {title}", "", span, ""]
        table = []
        for m in HISTORY_METRICS:
            values = [None if _missing(v) else v for v in group[m.name]]
            if all(v is None for v in values):
                continue
            present = [v for v in values if v is not None]
            move = find_move(values, runs, m, rules)
            if move is None:
                moved = "—"
            else:
                change = f"{fmt_value(move.before, m)} → {fmt_value(move.after, m)}"
                d = fmt.delta(move.delta, "" if m.kind is Kind.LABEL else
                              ("%" if m.relative else "pp" if m.kind is Kind.PCT else m.unit))
                moved = (f"{fmt.markdown(move.at)}: {fmt.markdown(change)}"
                         + (f" ({d})" if d else ""))
            level = None if m.kind is Kind.LABEL else rolling_median(values)
            table.append([
                m.name, fmt.markdown(fmt_value(present[0], m)),
                fmt.markdown(fmt_value(present[-1], m)),
                "" if level is None else fmt.markdown(fmt_value(level, m)),
                "" if m.kind is Kind.LABEL else sparkline(values), moved,
            ])
        headers = ["metric", "first", "last", f"median, last {ROLLING_RUNS}", "trend",
                   "moved at"]
        out += [tabulate(table, headers=headers, tablefmt="github", disable_numparse=True), ""]
    return "\n".join(out)


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and v != v)


def fmt_value(v: Any, m: Metric) -> str:
    return fmt.value(v, m.unit)
