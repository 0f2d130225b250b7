"""Identical layers get identical shares (issue #23: one of six identical layers took 47-87 % of
backward with a small noise figure): a preemption inside a sampled step lands in one module,
so the thread's waits for a CPU are left out where they happened, or -- where they cannot be
read -- the preempted sample is left out.

The traced runs spend fake time (``fakes.FakeClock``) and preempt on purpose: a layer's
backward is stretched by 10 ms that the thread's fake runqueue wait (``fakes.FakeWait``) also
counts, or does not (no schedstats). Identical layers then get exactly a sixth whatever the
machine's load; real preemptions on a loaded machine are what test_modules.py's stopwatch
check meets."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import traceml_ci as traceml
from tests.tracer.conftest import finish_and_load
from tests.tracer.fakes import FakeClock, FakeWait
from tests.tracer.loops import BusyBackward
from traceml_ci.tracer.clocks import HostClock
from traceml_ci.tracer.modules import ModuleSampler, _Sample, keep_samples

LAYERS = 6
MS = 1_000_000  # ns


class Block(nn.Module):
    """1 ms (fake) of forward and 1 ms of backward; ``preempt_ms`` more in its next backward,
    a wait for a CPU (the fake clock and the thread's fake wait both move on), when set."""

    def __init__(self, width: int, clock: FakeClock, wait: FakeWait) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.clock, self.wait = clock, wait
        self.preempt_ms = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.advance(1000.0)
        return BusyBackward.apply(torch.tanh(self.lin(x)), 1.0, self._backward)

    def _backward(self, ms: float) -> None:
        self.clock.advance(ms * 1000.0)
        if self.preempt_ms:
            self.clock.advance(self.preempt_ms * 1000.0)
            self.wait.advance(self.preempt_ms * 1000.0)
            self.preempt_ms = 0.0


class Stack(nn.Module):
    """Six identical blocks between a small embedding and head; in one sampled step in
    ``every``, one of the blocks is preempted (each in turn)."""

    def __init__(self, clock: FakeClock, wait: FakeWait, every: int, width: int = 32) -> None:
        super().__init__()
        self.every = every
        self.embed = nn.Linear(16, width)
        self.layer = nn.ModuleList(Block(width, clock, wait) for _ in range(LAYERS))
        self.head = nn.Linear(width, 1)
        self.sampled = 0  # steps whose forward carried the sampler's hooks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed._forward_hooks:  # a sampled step
            if self.sampled % self.every == 0:
                self.layer[self.sampled // self.every % LAYERS].preempt_ms = 10.0
            self.sampled += 1
        x = self.embed(x)
        for block in self.layer:
            x = block(x)
        return self.head(x)


def layer_shares(mods: dict, direction: str = "backward") -> dict[str, float]:
    """Each block's share of what the six blocks took together, in %."""
    rows = {m["name"]: m["share_pct"] for m in mods[direction]}
    names = [f"layer.{i}" for i in range(LAYERS)]
    assert all(n in rows for n in names), rows
    total = sum(rows[n] for n in names)
    return {n: 100.0 * rows[n] / total for n in names}


@pytest.mark.parametrize(("readings", "every"), [(True, 1), (False, 3)],
                         ids=["schedstat", "no-schedstat"])
def test_six_identical_layers_each_get_a_sixth_of_backward(fresh_tracer, fake_waits,
                                                           readings: bool, every: int) -> None:
    """With readings every sample is preempted (clean samples, preferred, would leave the
    preempted ones out: the waits must be taken out where they fell); without, one in three
    is (the slow ones are left out)."""
    clock = FakeClock()
    fake_waits.available = readings
    tracer = fresh_tracer(warmup_steps=3, module_sample_s=0.02, clock=clock)
    torch.manual_seed(0)
    model = Stack(clock, fake_waits, every)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    for _ in range(60):
        with traceml.trace_step(model):
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
    doc = finish_and_load(tracer)
    mods = doc["modules"]
    preempted = (model.sampled + every - 1) // every
    assert mods["backward_steps"] == model.sampled >= 8 and preempted >= 3
    # With readings the waits are left out where they fell, of the layer and of backward;
    # without, the preempted samples (16 ms against 6) are left out whole. A preempted
    # layer taking the lot, the bug this guards, is 11/16 of its sample's backward.
    assert mods["backward_left_out"] == (0 if readings else preempted)
    assert mods["backward_ms"] == pytest.approx(6.0)
    for direction in ("forward", "backward"):
        shares = layer_shares(mods, direction)
        assert all(s == pytest.approx(100.0 / LAYERS, abs=0.01) for s in shares.values()), (
            direction, shares)


def _uniform_sample(wait_in: int | None, wait_ms: int = 10) -> _Sample:
    """A sampled step whose six layers take 1 ms each of forward and of backward, the thread
    preempted for ``wait_ms`` inside layer ``wait_in``'s backward (its marks stretch by that),
    with the wait readings the hooks take at every mark."""
    s = _Sample()
    f0, b0 = 0, 100 * MS
    extra = wait_ms * MS if wait_in is not None else 0
    s.root = [f0, f0 + LAYERS * MS, b0, b0 + LAYERS * MS + extra]
    s.backward_done = True
    waited = 0
    t = b0
    s.waits["backward"].append((t, waited, t, False))
    for i in reversed(range(LAYERS)):  # backward runs the last layer first
        start = t
        t += MS + (extra if i == wait_in else 0)
        if i == wait_in:
            waited += extra
        c0 = f0 + i * MS
        s.calls.append([f"layer.{i}", c0, c0 + MS, start, t, False, None, None])
        s.waits["backward"].append((t, waited, t, False))
    return s


def test_a_preempted_layer_does_not_take_the_lot() -> None:
    """The wait is read in the hooks: left out of the layer it fell in, and of backward."""
    sampler = ModuleSampler(lambda _: None)
    sampler.clock = HostClock()
    sampler.ancestors = {f"layer.{i}": () for i in range(LAYERS)}
    for i in range(8):
        sampler._add(_uniform_sample(wait_in=i % LAYERS))
    mods = sampler.summary()
    assert mods is not None and mods["backward_left_out"] == 0
    assert abs(mods["backward_ms"] - LAYERS) < 1e-6  # ms: the 10 ms waits are gone
    shares = layer_shares(mods)
    assert all(abs(s - 100.0 / LAYERS) < 1e-6 for s in shares.values()), shares

    # The same marks without readings (no schedstats): before, the preempted layer took
    # (10 + 1) / 16 of that sample; now the sample is left out.
    blind = ModuleSampler(lambda _: None)
    blind.clock = HostClock()
    blind.ancestors = sampler.ancestors
    for i in range(8):
        s = _uniform_sample(wait_in=2 if i == 5 else None)
        s.waits["backward"].clear()
        blind._add(s)
    mods = blind.summary()
    assert mods is not None and mods["backward_left_out"] == 1
    shares = layer_shares(mods)
    assert all(abs(s - 100.0 / LAYERS) < 1e-6 for s in shares.values()), shares


def test_keep_samples_prefers_clean_samples() -> None:
    fast, slow = [(1.0, None, None)], [(3.0, None, None)]
    assert keep_samples(fast * 6 + slow * 2) == [0, 1, 2, 3, 4, 5]
    # Three clean of five: the fastest four are kept.
    assert keep_samples(slow + fast * 3 + slow) == [0, 1, 2, 3]
    # With readings: the clean ones when they are the most; else all (their waits are out).
    clean, waited = [(2.0, 0.05, None)], [(2.0, 1.0, None)]
    assert keep_samples(clean * 5 + waited) == [0, 1, 2, 3, 4]
    assert keep_samples(clean + waited * 5) == [0, 1, 2, 3, 4, 5]
    assert keep_samples([]) == []
