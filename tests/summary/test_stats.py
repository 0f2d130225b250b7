"""Robust statistics used at finish."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from traceml_ci.summary import stats


def test_percentile_interpolates() -> None:
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 0) == 1.0
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    with pytest.raises(ValueError):
        stats.percentile([], 50)


def test_tukey_fences_drop_far_outliers_only() -> None:
    values = [10.0, 10.2, 9.9, 10.1, 10.0, 9.8, 10.3, 500.0]
    assert stats.tukey_keep_mask(values, 3.0) == [True] * 7 + [False]
    periodic = [1.0, 1.0, 1.0, 9.0] * 10  # a regular pattern is kept
    assert all(stats.tukey_keep_mask(periodic, 3.0))


def test_windows_cover_everything_in_order() -> None:
    assert stats.windows(9, 10, 5) == []
    w = stats.windows(53, 10, 5)
    assert len(w) == 10 and w[0][0] == 0 and w[-1][1] == 53
    assert all(a[1] == b[0] for a, b in zip(w, w[1:], strict=False))


def test_theil_sen_ignores_a_spike() -> None:
    xs = [float(i) for i in range(50)]
    ys = [2.0 * x + 1.0 for x in xs]
    ys[10] = 10_000.0
    assert stats.theil_sen_slope(xs, ys) == pytest.approx(2.0)


@given(st.lists(st.floats(min_value=0, max_value=1e6), min_size=1, max_size=200))
def test_median_lies_within_range(values: list[float]) -> None:
    m = stats.median(values)
    assert min(values) <= m <= max(values)
