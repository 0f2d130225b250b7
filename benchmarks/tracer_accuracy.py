"""Attribution accuracy: a loop with known per-phase costs (busy-waits), traced in auto mode.

Costs per step: 8 ms in the dataset's __getitem__ (batch of 1), 4 ms in forward, 6 ms in a custom
autograd backward, 2 ms in the optimizer step. The truth is measured independently of the tracer:
each busy-wait records how long it really ran (a preempted wait overshoots; the truth follows), and
the loop records each step's wall time from the end of one step to the end of the next. Truth of a
phase = its busy time / step wall time, summed over the analysed steps.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import traceml_ci as traceml  # noqa: E402
from traceml_ci.tracer import api  # noqa: E402
from traceml_ci.tracer.config import TracerConfig  # noqa: E402

COSTS_MS = {"dataloader": 8.0, "forward": 4.0, "backward": 6.0, "optimizer": 2.0}


ACTUAL_MS = dict.fromkeys(COSTS_MS, 0.0)


def busy(ms: float, phase: str) -> None:
    start = time.perf_counter()
    end = start + ms / 1000.0
    now = start
    while now < end:
        now = time.perf_counter()
    ACTUAL_MS[phase] += (now - start) * 1000.0


class Data(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        busy(COSTS_MS["dataloader"], "dataloader")
        return torch.ones(8), torch.ones(1)


class SlowBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        busy(COSTS_MS["backward"], "backward")
        return g


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        busy(COSTS_MS["forward"], "forward")
        return SlowBackward.apply(self.lin(x))


class SlowSGD(torch.optim.SGD):
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        busy(COSTS_MS["optimizer"], "optimizer")
        return super().step(closure)


WARMUP = 5


def measure(
    steps: int, out_dir: Path, traced: bool = True
) -> tuple[dict[str, Any] | None, dict[str, float], dict[str, float]]:
    """(the tracer's step_time section, stopwatch truth in pct, busy-wait truth in pct).

    The stopwatch truth times exactly the calls the tracer attributes (next(), the model call,
    loss.backward(), optimizer.step()) with perf_counter around each, independently of it.
    ``traced=False``: the same loop with no tracer at all (no step_time section): what each
    phase's own framework work costs over its busy-wait, without the tracer.
    """
    tracer = None
    if traced:
        tracer = api.start(TracerConfig(out_dir=out_dir, warmup_steps=WARMUP), at_exit=False)
    step_scope = traceml.trace_step if traced else (lambda model: contextlib.nullcontext())
    model = Model()
    optimizer = SlowSGD(model.parameters(), lr=0.01)
    it = iter(torch.utils.data.DataLoader(Data(), batch_size=1))
    clock = time.perf_counter
    wall = 0.0
    watch = dict.fromkeys(COSTS_MS, 0.0)
    busy_ms = dict.fromkeys(COSTS_MS, 0.0)
    for i in range(steps):
        t0 = clock()
        x, y = next(it)
        t1 = clock()
        with step_scope(model):
            optimizer.zero_grad(set_to_none=True)
            t2 = clock()
            out = model(x)
            t3 = clock()
            loss = ((out - y) ** 2).mean()
            t4 = clock()
            loss.backward()
            t5 = clock()
            optimizer.step()
            t6 = clock()
        t7 = clock()
        if i >= WARMUP:
            wall += t7 - t0
            for p, d in (
                ("dataloader", t1 - t0),
                ("forward", t3 - t2),
                ("backward", t5 - t4),
                ("optimizer", t6 - t5),
            ):
                watch[p] += d
                busy_ms[p] += ACTUAL_MS[p]
        for p in ACTUAL_MS:
            ACTUAL_MS[p] = 0.0
    wall_ms = wall * 1000.0
    stopwatch = {p: 100.0 * v / wall for p, v in watch.items()}
    busy_truth = {p: 100.0 * v / wall_ms for p, v in busy_ms.items()}
    if tracer is None:
        return None, stopwatch, busy_truth
    path = tracer.finish()
    api.stop()
    return json.loads(Path(path).read_text())["step_time"], stopwatch, busy_truth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    worst = worst_busy = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            st, stopwatch, busy_truth = measure(args.steps, Path(tmp) / str(r))
            step = st["step_ms"]["median"]
            print(f"run {r + 1}: median step {step:.3f} ms ({sum(COSTS_MS.values()):.0f} ms busy)")
            for phase in COSTS_MS:
                truth = stopwatch[phase]
                got = st[f"{phase}_pct"]
                worst = max(worst, abs(got - truth))
                worst_busy = max(worst_busy, abs(got - busy_truth[phase]))
                busy_pct = busy_truth[phase]
                print(
                    f"  {phase:<10} {got:6.2f}%  stopwatch {truth:6.2f}% ({got - truth:+.2f} pp)"
                    f"  busy-wait only {busy_pct:6.2f}% ({got - busy_pct:+.2f} pp)"
                )
            print(f"  {'other':<10} {st['other_pct']:6.2f}%  (loss, zero_grad, loop glue)")
        # The same loop with no tracer: each phase's own work over its busy-wait. The traced
        # "busy-wait only" gaps above should match these: what is left is the tracer's.
        _, stopwatch, busy_truth = measure(args.steps, Path(tmp) / "untraced", traced=False)
        print("untraced (no tracer installed): each call's own work over its busy-wait")
        for phase in COSTS_MS:
            own = stopwatch[phase] - busy_truth[phase]
            print(f"  {phase:<10} stopwatch {stopwatch[phase]:6.2f}%  (+{own:.2f} pp own work)")
    print(f"max |error| vs stopwatch: {worst:.2f} pp (target <= 1.0)")
    print(f"max |error| vs busy-wait costs alone: {worst_busy:.2f} pp (includes each phase's own")
    print("  framework work, e.g. DataLoader collation and the autograd engine, as 'error')")


if __name__ == "__main__":
    main()
