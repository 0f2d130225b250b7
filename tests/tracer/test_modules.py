"""Per-module forward time, sampled: the slow submodule is named, its share agrees with a
stopwatch inside the model, and no hook outlives its sampled step.

On the real clock on purpose: the hooks' own cost (calibrated per run, then scaled against
unhooked forwards) is real time, which a fake clock sees as nothing; this is the check that
it is left out of real shares. The sampler's rules on exact fake time:
test_module_backward.py and test_module_uniform.py."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch import nn

import traceml_ci as traceml
from tests.conftest import spin_cpu, stopwatch_tolerance_pp
from tests.tracer.conftest import finish_and_load
from traceml_ci.summary.schema import summary_problems
from traceml_ci.tracer.modules import select_modules


class Layer(nn.Module):
    """A linear layer that also spins ``ms``; its own stopwatch records each call."""

    def __init__(self, ms: float, log: list[tuple[float, bool]]) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.ms, self.log = ms, log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t0 = time.thread_time_ns()
        spin_cpu(self.ms)
        out = torch.relu(self.lin(x))
        # (ms, whether this call is a sampled one: the sampler's hooks are on it)
        self.log.append(((time.thread_time_ns() - t0) / 1e6, bool(self._forward_hooks)))
        return out


class Encoder(nn.Module):
    def __init__(self, costs: list[float], logs: list[list[tuple[float, bool]]]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(Layer(ms, log) for ms, log in zip(costs, logs, strict=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x)
        return x


class Net(nn.Module):
    def __init__(self, costs: list[float]) -> None:
        super().__init__()
        self.logs: list[list[tuple[float, bool]]] = [[] for _ in costs]
        self.forward_log: list[tuple[float, bool]] = []
        self.embed = nn.Linear(8, 16)
        self.encoder = Encoder(costs, self.logs)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t0 = time.thread_time_ns()
        # sampled: the sampler's hooks are on the submodules (a step that times the model's
        # forward unhooked, to compare, hooks the model alone)
        sampled = bool(self.embed._forward_hooks)
        out = self.head(self.encoder(self.embed(x)))
        self.forward_log.append(((time.thread_time_ns() - t0) / 1e6, sampled))
        return out


def _train(model: Net, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    for _ in range(steps):
        with traceml.trace_step(model):
            opt.zero_grad(set_to_none=True)
            ((model(x) - y) ** 2).mean().backward()
            opt.step()


def test_the_slow_submodule_is_named_with_its_share(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=2)
    tracer.module_sampler.every_ns = 30_000_000  # a sample every 30 ms: several in the test
    model = Net([0.2, 0.2, 0.2, 2.0])
    _train(model, 150)
    doc = finish_and_load(tracer)
    assert summary_problems(doc) == []
    mods = doc["modules"]
    assert mods["sampled_steps"] >= 3
    top = mods["forward"]
    names = [m["name"] for m in top]
    # The encoder holds the layers (inclusive times); among the layers, layer 3 is first.
    assert names[0] == "encoder"
    layers = [m for m in top if m["name"].startswith("encoder.layer.")]
    assert layers[0]["name"] == "encoder.layer.3"
    # Its share of forward against the stopwatches inside the model on the UNsampled steps,
    # which carry no hooks (issue #23: before the hooks' cost was left out, the share sat
    # 6-14 pp below). The stopwatches read the thread's CPU time: beside other work, the
    # tracer leaves the thread's waits for a CPU out too.
    assert sum(s for _, s in model.forward_log) == mods["sampled_steps"]
    # The unhooked forwards it measured them against (``ModuleSampler.leak_scale``).
    assert len(tracer.module_sampler.plain) >= 3
    plain = [i for i, (_, s) in enumerate(model.forward_log) if not s][2:]  # after warmup
    bare = (
        100.0
        * sum(model.logs[3][i][0] for i in plain)
        / sum(model.forward_log[i][0] for i in plain)
    )
    tolerance = stopwatch_tolerance_pp(doc, 3.0)
    share = layers[0]["share_pct"]
    assert abs(share - bare) < tolerance, (layers[0], bare, tolerance)
    # The model's forward as the tracer counts it is an unhooked step's, not a hooked one's.
    hooked = [ms for ms, sampled in model.forward_log if sampled]
    plain_ms = statistics.median(model.forward_log[i][0] for i in plain)
    # The hooks cost ~15 % of this forward (quiet: 2.9 against 3.4 ms hooked); a CPU shared
    # with other sessions stretches the tracer's wall-less-waits figure past the thread's CPU
    # time by as much (seen: 3.87 against 3.72 hooked, load ~7 on 2 cores), so the margin
    # widens with the run's measured runqueue wait, as the shares' tolerance does.
    wait = doc["run"]["contention"]["runqueue_wait_pct"] or 0.0
    limit = statistics.median(hooked) * (1.0 + 0.2 * wait / 100.0)
    assert mods["forward_ms"] < limit, (mods["forward_ms"], hooked, wait)
    assert abs(mods["forward_ms"] - plain_ms) < 0.15 * plain_ms, (mods["forward_ms"], plain_ms)
    # No hook is left on any module once the run is over.
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks


def test_modules_chosen_by_whole_levels_through_containers() -> None:
    model = Net([0.0] * 4)
    names = [n for n, _ in select_modules(model)]
    assert names[:3] == ["embed", "encoder", "head"]
    # The ModuleList is looked through: its entries are the second level, their linears the third.
    assert names[3:7] == [f"encoder.layer.{i}" for i in range(4)]
    assert names[7:] == [f"encoder.layer.{i}.lin" for i in range(4)]
    # A level that does not fit whole is left out; the first level is cut to the limit.
    assert [n for n, _ in select_modules(model, limit=9)] == names[:7]
    assert len(select_modules(model, limit=2)) == 2


def test_unsampled_steps_carry_no_hooks(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=0)
    tracer.module_sampler.every_ns = 10**12  # armed once at most
    model = Net([0.0] * 4)
    seen: list[int] = []

    def count_hooks(module: Any, args: Any) -> None:
        seen.append(
            (len(model._forward_hooks), sum(len(m._forward_hooks) for m in model.modules()))
        )

    handle = model.embed.register_forward_pre_hook(count_hooks)
    _train(model, 40)
    handle.remove()
    finish_and_load(tracer)
    # Our own hooks on the submodules: on at most one step's forward. The model's own (its
    # forward timed unhooked, to compare): on two later forwards at most, the one it lets
    # pass (it follows the between-steps housekeeping) and the one it times. The rest ran
    # with none.
    assert sum(1 for own, every in seen if every > own) <= 1, seen
    assert sum(1 for own, every in seen if own and every == own) <= 2, seen
    assert sum(1 for own, every in seen if every == 0) >= len(seen) - 3, seen
