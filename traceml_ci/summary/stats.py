"""Robust statistics on per-step values: percentiles, outlier fences, windows, robust slopes.

Pure Python on purpose: it runs once at finish on at most ~100k values, and keeps this layer
free of numpy/pandas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of an already sorted, non-empty sequence."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("percentile of an empty sequence")
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def median(values: Sequence[float]) -> float:
    return percentile(sorted(values), 50.0)


def iqr(values: Sequence[float]) -> float:
    s = sorted(values)
    return percentile(s, 75.0) - percentile(s, 25.0)


def tukey_keep_mask(values: Sequence[float], k: float) -> list[bool]:
    """True for values inside Tukey's fences [Q1 - k*IQR, Q3 + k*IQR].

    With k=3 ("far out") this drops rare extreme steps (checkpoint saves, GC pauses) while
    keeping any regular pattern, which has a wide IQR of its own.
    """
    if len(values) < 4:
        return [True] * len(values)
    s = sorted(values)
    q1, q3 = percentile(s, 25.0), percentile(s, 75.0)
    spread = q3 - q1
    # A floor on the spread keeps near-constant series from flagging tiny jitter as outliers.
    spread = max(spread, 0.02 * abs(percentile(s, 50.0)))
    lo, hi = q1 - k * spread, q3 + k * spread
    return [lo <= v <= hi for v in values]


def windows(n: int, target_windows: int, min_window: int) -> list[tuple[int, int]]:
    """Split range(n) into up to ``target_windows`` consecutive [start, end) windows of at least
    ``min_window`` items each; fewer than two windows -> empty list."""
    count = min(target_windows, n // min_window)
    if count < 2:
        return []
    size = n // count
    return [(i * size, (i + 1) * size if i < count - 1 else n) for i in range(count)]


def theil_sen_slope(xs: Sequence[float], ys: Sequence[float], max_points: int = 200) -> float:
    """Median of pairwise slopes (robust to outliers); subsamples evenly to bound O(n^2)."""
    n = len(xs)
    if n < 2:
        return 0.0
    if n > max_points:
        idx = [round(i * (n - 1) / (max_points - 1)) for i in range(max_points)]
        xs = [xs[i] for i in idx]
        ys = [ys[i] for i in idx]
        n = max_points
    slopes = [
        (ys[j] - ys[i]) / (xs[j] - xs[i])
        for i in range(n)
        for j in range(i + 1, n)
        if xs[j] != xs[i]
    ]
    return median(slopes) if slopes else 0.0
