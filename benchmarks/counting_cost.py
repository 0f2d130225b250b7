"""The counters' fixed cost: one step of each smoke job of benchmarks/cisuite (the CNN, the
tiny GPT-2 with AdamW, the MLP) with the counter probe armed (tracer/counters.py: the ATen ops
by kind, phase and line, allocations, the settings, scalar reads, new storages, graph nodes
marked, collectives, copies) against the same step unarmed, and a step with its Python calls
counted (tracer/pycalls.py: two such steps follow the sampled one), side by side in one
process. The probe arms on warmup steps of a run, never on analysed ones: the sampled step's
extra plus twice the Python-counted step's is what the counters cost a run (issue 32: at most
100 ms on these jobs).

    .venv/bin/python benchmarks/counting_cost.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent / "cisuite" / "mlrepo"))

from mlrepo.models import MLP, SmallCNN, tiny_gpt2  # noqa: E402

from traceml_ci.tracer.counters import CounterProbe  # noqa: E402
from traceml_ci.tracer.pycalls import PythonCalls  # noqa: E402


def cnn() -> tuple[torch.nn.Module, Callable[[], None]]:
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return model, step


def gpt2() -> tuple[torch.nn.Module, Callable[[], None]]:
    model = tiny_gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    tokens = torch.randint(0, 512, (8, 64))

    def step() -> None:
        out = model(input_ids=tokens, labels=tokens)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, step


def mlp() -> tuple[torch.nn.Module, Callable[[], None]]:
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 64), torch.randn(16, 1)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()
        opt.step()

    return model, step


def timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"{'job':6} {'plain step ms':>14} {'armed step ms':>14} {'added ms':>9} "
          f"{'py step ms':>11} {'py added':>9} {'run adds ms':>12} {'ops/step':>9} "
          f"{'kinds':>6} {'py calls':>9}")
    for name, make in (("cnn", cnn), ("gpt2", gpt2), ("mlp", mlp)):
        model, step = make()
        for _ in range(3):
            step()  # lazy state (the optimizer's) built, caches warm
        plain, armed, py, ops, kinds, calls = [], [], [], 0, 0, 0
        for _ in range(args.repeats):
            plain.append(timed(step))
            probe = CounterProbe(warn=lambda msg: print("warning:", msg, file=sys.stderr))

            def counted(probe: CounterProbe = probe, model: torch.nn.Module = model,
                        step: Callable[[], None] = step) -> None:
                assert probe.begin(1, 5, (model,))
                step()
                probe.end(2)

            armed.append(timed(counted))
            block = probe.record() or {}
            ops, kinds = block["ops"]["per_step"], len(block["ops"]["kinds"])
            probe.close()
            count = PythonCalls()

            def python(count: PythonCalls = count, step: Callable[[], None] = step) -> None:
                assert count.start()
                step()
                count.stop(None)

            py.append(timed(python))
            calls = (count.block or {}).get("per_step", 0)
        p, a, c = statistics.median(plain), statistics.median(armed), statistics.median(py)
        print(f"{name:6} {p:14.2f} {a:14.2f} {a - p:9.1f} {c:11.2f} {c - p:9.1f} "
              f"{a - p + 2 * (c - p):12.1f} {ops:9d} {kinds:6d} {calls:9d}")


if __name__ == "__main__":
    main()
