"""Known costs for the framework tests, and an independent stopwatch around them.

Busy-waits sit where each phase really runs -- the dataset's ``__getitem__`` (plus the
collate), the model's forward, a custom autograd backward and an optimizer subclass's step --
and a ``perf_counter`` stopwatch times each of those calls whole in the same run (backward: the
call that runs it, e.g. ``accelerator.backward``). The truth for a
phase is its exclusive time (an optimizer step that runs forward and backward in its closure
counts only its own time), as a share of the wall time between optimizer steps.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from tests.conftest import busy, stopwatch_tolerance_pp
from tests.tracer.loops import BusyBackward
from traceml_ci.summary.stats import tukey_keep_mask

PHASES = ("dataloader", "forward", "backward", "optimizer")
now = time.perf_counter


class Stopwatch:
    """Intervals per phase and the end of every optimizer step, in perf_counter seconds."""

    def __init__(self) -> None:
        self.events: dict[str, list[tuple[float, float]]] = {p: [] for p in PHASES}
        self.step_ends: list[float] = []

    def add(self, phase: str, t0: float, t1: float) -> None:
        self.events[phase].append((t0, t1))

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps({"events": self.events, "step_ends": self.step_ends}))

    @classmethod
    def load(cls, path: Path) -> Stopwatch:
        doc = json.loads(path.read_text())
        watch = cls()
        watch.events = {p: [tuple(e) for e in doc["events"][p]] for p in PHASES}
        watch.step_ends = doc["step_ends"]
        return watch

    def exclusive(self) -> list[tuple[str, float, float]]:
        """Every interval as (phase, end, exclusive seconds): nested intervals of other phases
        (forward and backward inside an optimizer closure) are taken out of the outer one; an
        interval inside one of its own phase (the spun step inside a framework's wrapper of
        it, timed whole) is already counted there."""
        flat = sorted((t0, t1, p) for p in PHASES for t0, t1 in self.events[p])
        flat = [(t0, t1, p) for t0, t1, p in flat
                if not any(q == p and a <= t0 and t1 <= b and (a, b) != (t0, t1)
                           for a, b, q in flat)]
        out = []
        for t0, t1, p in flat:
            inner = sum(b - a for a, b, q in flat if q != p and t0 < a and b < t1)
            out.append((p, t1, (t1 - t0) - inner))
        return out

    def shares(self, warmup: int) -> dict[str, float]:
        """Percent of wall time per phase over the steps after ``warmup``; a step runs from the
        end of the previous optimizer step to the end of its own. Far outlier steps are left
        out, by the rule the tracer uses."""
        ends = self.step_ends
        assert len(ends) > warmup + 2, f"only {len(ends)} optimizer steps"
        windows = list(zip(ends[warmup - 1 : -1], ends[warmup:], strict=True))
        per = [dict.fromkeys(PHASES, 0.0) for _ in windows]
        for p, t1, secs in self.exclusive():
            for i, (a, b) in enumerate(windows):
                if a < t1 <= b:
                    per[i][p] += secs
                    break
        walls = [b - a for a, b in windows]
        keep = tukey_keep_mask(walls, 3.0)
        wall = sum(w for w, k in zip(walls, keep, strict=True) if k)
        return {
            p: 100.0 * sum(s[p] for s, k in zip(per, keep, strict=True) if k) / wall for p in PHASES
        }

    def seconds_per_step(self, warmup: int) -> float:
        ends = self.step_ends
        return (ends[-1] - ends[warmup - 1]) / (len(ends) - warmup)


class SpinDataset(torch.utils.data.Dataset):
    """Each item costs ``item_ms``; ``make(i)`` builds it."""

    def __init__(self, n: int, item_ms: float, make: Any, watch: Stopwatch) -> None:
        self.n, self.item_ms, self.make, self.watch = n, item_ms, make, watch

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        t0 = now()
        busy(self.item_ms)
        item = self.make(i)
        self.watch.add("dataloader", t0, now())
        return item

    def __getitems__(self, indices: list[int]) -> list[Any]:
        """A batch's items (the DataLoader asks for them at once), timed as one stretch: the
        fetch loop between the items is the loader's work too, and on a loaded machine a
        preemption lands there as often as in the items."""
        t0 = now()
        items = []
        for i in indices:
            busy(self.item_ms)
            items.append(self.make(i))
        self.watch.add("dataloader", t0, now())
        return items


def timed_collate(collate: Any, watch: Stopwatch) -> Any:
    """The collate is part of the DataLoader's ``next()``: timed as dataloader too."""

    def run(items: list) -> Any:
        t0 = now()
        batch = collate(items)
        watch.add("dataloader", t0, now())
        return batch

    return run


def spin_backward(loss: torch.Tensor, ms: float) -> torch.Tensor:
    """``loss`` unchanged; its backward costs ``ms`` more."""
    return BusyBackward.apply(loss, ms)


def spin_forward(net: Any, x: Any, ms: float, watch: Stopwatch) -> Any:
    """``net(x)`` as a forward of known cost: ``ms`` of busy-wait first, the whole timed as
    forward."""
    t0 = now()
    busy(ms)
    out = net(x)
    watch.add("forward", t0, now())
    return out


def timed(fn: Any, phase: str, watch: Stopwatch, ends_step: bool = False) -> Any:
    """``fn``, each call timed whole as ``phase`` (e.g. the framework's backward call); with
    ``ends_step``, each call's end is an optimizer step's end (the framework's wrapper of a
    ``spin_optimizer(..., ends_step=False)``)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        t0 = now()
        try:
            return fn(*args, **kwargs)
        finally:
            t1 = now()
            watch.add(phase, t0, t1)
            if ends_step:
                watch.step_ends.append(t1)

    return run


def timed_batches(loader: Any, watch: Stopwatch) -> Any:
    """``loader``'s batches, each ``next()`` timed whole as dataloader: the time the loop
    waits for a batch, with the framework's own loader machinery around the dataset's."""
    it = iter(loader)
    while True:
        t0 = now()
        try:
            batch = next(it)
        except StopIteration:
            return
        watch.add("dataloader", t0, now())
        yield batch


def spin_optimizer(base: type, ms: float, watch: Stopwatch, ends_step: bool = True) -> type:
    """A subclass of optimizer class ``base`` whose ``step`` costs ``ms`` more, timed whole
    (a closure it runs included; ``Stopwatch.exclusive`` takes nested phases out); its end
    is the step's end unless a wrapper timed with ``ends_step`` marks that instead."""

    class Spin(base):  # type: ignore[misc, valid-type]
        def step(self, closure: Any = None) -> Any:
            t0 = now()
            busy(ms)
            result = super().step(closure)
            t1 = now()
            watch.add("optimizer", t0, t1)
            if ends_step:
                watch.step_ends.append(t1)
            return result

    Spin.__name__ = f"Spin{base.__name__}"
    return Spin


def assert_one_step_per_optimizer_step(doc: dict, watch: Stopwatch, steps: int, warmup: int,
                                       name: str) -> None:
    """A completed run named ``name`` whose steps are the ``steps`` optimizer steps the stopwatch
    saw, the first ``warmup`` of them left out of the analysis."""
    st = doc["step_time"]
    assert len(watch.step_ends) == steps
    assert st["steps_total"] == steps
    assert st["steps_analyzed"] == steps - warmup
    assert doc["run"]["name"] == name
    assert doc["run"]["status"] == "completed"


def assert_shares_match(doc: dict, watch: Stopwatch, tolerance_pp: float = 2.0,
                        dataloader_pp: float | None = None) -> None:
    """Each phase's share in the summary within ``tolerance_pp`` of the stopwatch's (widened
    by the run's own measured contention: ``stopwatch_tolerance_pp``); the dataloader's within
    ``dataloader_pp`` where given (a loader whose own fetch loop the stopwatch cannot cover)."""
    st = doc["step_time"]
    truth = watch.shares(st["warmup_steps"])
    got = {p: st[f"{p}_pct"] for p in PHASES}
    off = {p: round(got[p] - truth[p], 2) for p in PHASES}
    bound = {p: stopwatch_tolerance_pp(doc, tolerance_pp) for p in PHASES}
    if dataloader_pp is not None:
        bound["dataloader"] = stopwatch_tolerance_pp(doc, dataloader_pp)
    print(f"traceml {got}\nstopwatch { {p: round(v, 2) for p, v in truth.items()} }")  # with -s
    assert all(abs(off[p]) <= bound[p] for p in PHASES), (
        f"traceml {got} vs stopwatch {truth}: off by {off} pp (bounds {bound})"
    )
