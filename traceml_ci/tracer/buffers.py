"""Preallocated, fixed-size per-step columns: the tracer's memory does not grow with the run."""

from __future__ import annotations

from array import array

#: Steps kept exactly; past this, every 2nd, then 4th, ... step is kept (a uniform sample).
DEFAULT_CAPACITY = 100_000


class StepColumns:
    """Columns of float64 per step. Exact for the first ``capacity`` steps; when full, every
    other row is dropped and the stride doubles, so the rows stay a uniform sample of the run
    (medians and windows stay unbiased) in at most ``capacity * ncols * 8`` bytes."""

    __slots__ = ("cols", "capacity", "n", "stride", "seen")

    def __init__(self, ncols: int, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 2 or capacity % 2:
            raise ValueError("capacity must be an even number >= 2")
        self.cols = [array("d", bytes(8 * capacity)) for _ in range(ncols)]
        self.capacity = capacity
        self.n = 0
        self.stride = 1
        self.seen = 0

    def append(self, row: tuple[float, ...]) -> None:
        seen = self.seen
        self.seen = seen + 1
        if seen % self.stride:
            return
        if self.n == self.capacity:
            self._halve()
        i = self.n
        cols = self.cols
        for j, value in enumerate(row):
            cols[j][i] = value
        self.n = i + 1

    def append_host(
        self, step: float, dl: float, fwd: float, bwd: float, opt: float, wait: float,
        h2d: float,
    ) -> None:
        """``append`` of a host row (the seven time columns), unrolled: it runs every step."""
        seen = self.seen
        self.seen = seen + 1
        if seen % self.stride:
            return
        i = self.n
        if i == self.capacity:
            self._halve()
            i = self.n
        c = self.cols
        c[0][i] = step
        c[1][i] = dl
        c[2][i] = fwd
        c[3][i] = bwd
        c[4][i] = opt
        c[5][i] = wait
        c[6][i] = h2d
        self.n = i + 1

    def _halve(self) -> None:
        half = self.capacity // 2
        for col in self.cols:
            col[:half] = col[0 : self.capacity : 2]
        self.n = half
        self.stride *= 2

    def column(self, i: int) -> list[float]:
        return self.cols[i][: self.n].tolist()

    @property
    def nbytes(self) -> int:
        return sum(c.itemsize * len(c) for c in self.cols)
