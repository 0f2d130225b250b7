"""Student's t distribution for A/B's intervals (gate/ab/sequential.py): its CDF in closed form
and its
quantiles by bisection, so the gate needs no scipy."""

from __future__ import annotations

import math


def t975(df: int) -> float:
    """Student's t 97.5th percentile for ``df`` >= 1 degrees of freedom."""
    if df < 1:
        raise ValueError("an interval needs at least 2 rounds")
    return t_quantile(0.975, df)


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with integer ``df`` >= 1: the closed forms (Abramowitz and
    Stegun 26.7.3-4), exact to float rounding; no scipy in the gate."""
    theta = math.atan(abs(t) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:  # odd: (2/pi)(theta + sin cos (1 + 2/3 c2 + 2*4/(3*5) c2^2 + ...))
        term = total = 1.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        inside = (2 / math.pi) * (theta + (math.sin(theta) * math.cos(theta) * total
                                           if df > 1 else 0.0))
    else:  # even: sin (1 + 1/2 c2 + 1*3/(2*4) c2^2 + ...)
        term = total = 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        inside = math.sin(theta) * total
    return 0.5 + 0.5 * inside if t >= 0 else 0.5 - 0.5 * inside


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``df`` degrees of freedom."""
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return hi
