"""Per-module backward time, sampled: the module with a slow backward is named with its share;
modules called twice, in-place ops after a timed module, compiled models and device clocks are
handled as docs/pinpoint.md says.

These are the sampler's rules: the models spend fake time (``fakes.FakeClock``, the thread's
waits a ``fakes.FakeWait``), so shares and times are exact and samples fall due by the steps'
fake time. Modules on the real clock, against stopwatches: test_modules.py (the hooks' own
cost left out) and test_module_shares.py (readers of one input)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import traceml_ci as traceml
from tests.tracer.conftest import finish_and_load
from tests.tracer.fakes import FakeClock, FakeEventLog
from tests.tracer.loops import BusyBackward, spend_on, train_at_least
from traceml_ci.summary.keys import TOP_MODULES
from traceml_ci.tracer.clocks import DeviceEventClock
from traceml_ci.tracer.modules import OFF_COMPILED, ModuleSampler


@pytest.fixture
def clock(fake_waits) -> FakeClock:
    """The fake clock a test's tracer and model share (module waits faked with it)."""
    return FakeClock()


class _BackwardStart(torch.autograd.Function):
    """Identity; its backward (the first of the layer's) spends ``ms``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, ms: float,  # type: ignore[override]
                spend: Callable[[float], None]) -> torch.Tensor:
        ctx.ms, ctx.spend = ms, spend
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None, None]:  # type: ignore[override]
        ctx.spend(ctx.ms)
        return grad, None, None


class Layer(nn.Module):
    """Linear + ReLU whose forward spends ``forward_ms`` and backward ``backward_ms``."""

    def __init__(self, backward_ms: float, spend: Callable[[float], None],
                 forward_ms: float = 0.1) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.backward_ms, self.forward_ms = backward_ms, forward_ms
        self.spend = spend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.spend(self.forward_ms)
        return _BackwardStart.apply(torch.relu(self.lin(x)), self.backward_ms, self.spend)


class Net(nn.Module):
    """``costs``: each layer's backward (ms); ``forward_ms``: the model's own forward, outside
    every submodule."""

    def __init__(self, costs: list[float], spend: Callable[[float], None],
                 forward_ms: float = 0.0) -> None:
        super().__init__()
        self.forward_ms = forward_ms
        self.spend = spend
        self.embed = nn.Linear(8, 16)
        self.layer = nn.ModuleList(Layer(ms, spend) for ms in costs)
        self.head = nn.Linear(16, 1)
        self.sampled: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the sampler's hooks are on the submodules in this call (the model's alone: a step
        # timing its forward unhooked, to compare)
        self.sampled.append(bool(self.embed._forward_hooks))
        self.spend(self.forward_ms)
        x = self.embed(x)
        for layer in self.layer:
            x = layer(x)
        return self.head(x)


def _train(model: nn.Module, steps: int, clock: FakeClock, step_ms: float = 1.0) -> None:
    """``steps`` steps, each ``step_ms`` of fake time more between backward and the optimizer
    (samples fall due by the steps' time)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    train_at_least(model, opt, x, y, steps, 0.0,
                   after_backward=lambda: clock.advance(step_ms * 1000.0))


def test_the_module_with_a_slow_backward_is_named_with_its_share(fresh_tracer, clock) -> None:
    tracer = fresh_tracer(warmup_steps=2, module_sample_s=0.03, clock=clock)
    model = Net([0.2, 0.2, 0.2, 2.0], spend_on(clock))
    _train(model, 150, clock)
    doc = finish_and_load(tracer)
    mods = doc["modules"]
    assert mods["backward_steps"] == sum(model.sampled) >= 3 and mods["clock"] == "host"
    layers = [m for m in mods["backward"] if m["name"].startswith("layer.")]
    assert layers[0]["name"] == "layer.3"
    # The model's backward is its layers' (2.6 ms); layer 3 holds 2 of it, each other 0.2.
    assert mods["backward_ms"] == pytest.approx(2.6)
    shares = {m["name"]: m["share_pct"] for m in layers if m["name"].count(".") == 1}
    assert shares == {"layer.3": pytest.approx(100 * 2.0 / 2.6, abs=0.01),
                      **{f"layer.{i}": pytest.approx(100 * 0.2 / 2.6, abs=0.01)
                         for i in range(3)}}
    assert layers[0]["noise_pp"] == 0.0  # the same in every sample
    # The forward list is there too, and no hook is left behind.
    assert "layer.3" in {m["name"] for m in mods["forward"]}
    assert len(mods["forward"]) <= TOP_MODULES
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks


class Twice(nn.Module):
    """One block called twice per step (weights shared): its calls add up."""

    def __init__(self, spend: Callable[[float], None]) -> None:
        super().__init__()
        self.block = Layer(1.0, spend)
        self.head = nn.Linear(16, 1)
        self.proj = nn.Linear(8, 16)
        self.spend = spend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.block(self.proj(x))
        self.spend(0.5)  # between the two calls: the model's, not the block's
        return _BackwardStart.apply(self.head(self.block(h)), 0.25, self.spend)


def test_a_module_called_twice_adds_up_its_calls(fresh_tracer, clock) -> None:
    tracer = fresh_tracer(warmup_steps=2, module_sample_s=0.03, clock=clock)
    model = Twice(spend_on(clock))
    _train(model, 80, clock)
    mods = finish_and_load(tracer)["modules"]
    block = {d: next(m for m in mods[d] if m["name"] == "block") for d in ("forward", "backward")}
    # Both calls' backward (2 x 1 ms), not one, and not the span between them (+0.25 ms of
    # the model's own backward between them); forward alike (2 x 0.1 ms, not +0.5).
    assert block["backward"]["ms"] == pytest.approx(2.0)
    assert block["forward"]["ms"] == pytest.approx(0.2)
    assert mods["backward_ms"] == pytest.approx(2.25) and mods["forward_ms"] == pytest.approx(0.7)


class Costly(nn.Module):
    """A linear layer whose forward spends ``forward_ms`` and backward ``backward_ms`` (fake);
    its output is no view (a later in-place op on it is allowed)."""

    def __init__(self, n_in: int, n_out: int, clock: FakeClock, forward_ms: float = 0.5,
                 backward_ms: float = 0.25) -> None:
        super().__init__()
        self.lin = nn.Linear(n_in, n_out)
        self.spend = spend_on(clock)
        self.forward_ms, self.backward_ms = forward_ms, backward_ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.spend(self.forward_ms)
        return BusyBackward.apply(self.lin(x), self.backward_ms, self.spend)


class InPlaceAfter(nn.Module):
    """A timed module's output modified in place: full backward hooks would raise here."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.lin = Costly(8, 16, clock)
        self.act = nn.ReLU(inplace=True)
        self.out = Costly(16, 1, clock)
        self.sampled: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.lin(x)))


def test_in_place_ops_after_a_timed_module_still_train(fresh_tracer, clock) -> None:
    tracer = fresh_tracer(warmup_steps=1, module_sample_s=0.001, clock=clock)
    model = InPlaceAfter(clock)
    _train(model, 30, clock)
    doc = finish_and_load(tracer)
    assert doc["modules"]["backward_steps"] >= 1
    assert {m["name"] for m in doc["modules"]["backward"]} >= {"lin", "out"}


def test_a_compiled_model_is_not_sampled_and_says_why(fresh_tracer, clock) -> None:
    tracer = fresh_tracer(warmup_steps=1, module_sample_s=0.001, clock=clock)
    model = torch.compile(InPlaceAfter(clock), backend="eager")
    _train(model, 12, clock)
    doc = finish_and_load(tracer)
    assert doc["modules"] == {"sampled_steps": 0, "off": OFF_COMPILED, "forward": []}
    for module in model.modules():
        assert not module._forward_hooks


@pytest.mark.parametrize("how", ["init", "env"])
def test_module_sampling_can_be_turned_off(fresh_tracer, clock, monkeypatch, how: str) -> None:
    if how == "env":
        monkeypatch.setenv("TRACEML_CI_MODULE_SAMPLE_S", "0")
        tracer = fresh_tracer(warmup_steps=1, clock=clock)
    else:
        tracer = fresh_tracer(warmup_steps=1, module_sample_s=0, clock=clock)
    model = InPlaceAfter(clock)
    _train(model, 20, clock, step_ms=50.0)  # a second of steps: samples would be due
    assert "modules" not in finish_and_load(tracer)


def test_device_events_are_resolved_later_and_waited_for_at_finish() -> None:
    """The same sampler on a device clock (fake CUDA events): marks are events, resolved only
    once the "device" passed them; the last sample is waited for at stop."""
    torch.set_num_threads(1)
    clock = FakeClock()
    log = FakeEventLog(lag_records=10_000)  # nothing completes until a synchronize
    log.now = clock.mark  # the "device" runs on the fake clock
    sampler = ModuleSampler(lambda m: None, every_s=0.001)
    sampler.clock = DeviceEventClock(log.factory)
    model = Net([0.2, 0.2, 0.2, 5.0], spend_on(clock))
    sampler.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    for i in range(3):
        sampler.tick((i + 1) * 10**9)  # a sample due at each
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    assert sampler.steps["forward"] == 0 and log.queries > 0  # nothing resolved yet
    sampler.stop()
    assert log.syncs > 0
    doc = sampler.summary()
    assert doc is not None and doc["clock"] == "device_event"
    assert doc["sampled_steps"] == 3 and doc["backward_steps"] == 3
    # The fake events carry the fake clock's time: layer.3's backward is its 5 ms, exactly.
    layer3 = next(m for m in doc["backward"] if m["name"] == "layer.3")
    assert layer3["ms"] == pytest.approx(5.0), layer3
    assert doc["backward_ms"] == pytest.approx(5.6)


def test_a_device_clock_chosen_after_watch_keeps_sampling_without_unhooked_forwards() -> None:
    """As the Tracer does it: the sampler watches the model (and calibrates) on the host clock,
    then the device is found and its clock replaces the host's. The forwards timed unhooked
    to check the hooks' cost are host work: on the device clock none is armed, and sampling
    goes on step after step."""
    torch.set_num_threads(1)
    warnings: list[str] = []
    log = FakeEventLog(lag_records=0)
    sampler = ModuleSampler(warnings.append, every_s=0.001)
    model = Net([0.0, 0.0, 0.0, 0.5], lambda ms: None)
    sampler.watch(model)  # host clock: calibrated
    sampler.clock = DeviceEventClock(log.factory)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    hooked_root = []
    for step in range(1, 25):
        sampler.tick(time.perf_counter_ns() + step * 10**9, step)
        hooked_root.append((bool(model._forward_hooks), bool(model.embed._forward_hooks)))
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    sampler.stop()
    assert warnings == [] and sampler.enabled is False  # stop() ends it, nothing else did
    assert sampler.plain == []
    assert all(sub for root, sub in hooked_root if root)  # the model hooked alone: never
    assert sampler.steps["forward"] >= 4, sampler.steps


def test_a_failing_hook_stops_sampling_and_training_goes_on(fresh_tracer, capfd) -> None:
    clock = FakeClock()
    tracer = fresh_tracer(warmup_steps=1, module_sample_s=0.001, clock=clock)
    tracer.module_sampler.clock = FakeClock()  # the hooks' own clock, broken below
    model = InPlaceAfter(clock)
    calls = {"n": 0}

    def broken_mark() -> int:
        calls["n"] += 1
        raise RuntimeError("clock broke")

    tracer.module_sampler.clock.mark = broken_mark  # the hooks' clock fails inside the step
    _train(model, 20, clock)
    doc = finish_and_load(tracer)
    assert calls["n"] >= 1
    assert doc["step_time"]["steps_total"] >= 20  # every step recorded, none raised
    err = capfd.readouterr().err
    assert err.count("module sampling stopped") == 1


class Wide(nn.Module):
    """Many submodules with long names: the ``modules`` block stays bounded."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        # Blocks of distinct times (fake): no ties among the top rows.
        self.blocks = nn.ModuleDict({
            f"a_rather_long_descriptive_block_name_as_real_models_have_{i:02d}":
                nn.Sequential(Costly(16, 16, clock, 0.01 * (i + 1), 0.02 * (i + 1)), nn.ReLU())
            for i in range(40)})
        self.inp = nn.Linear(8, 16)
        self.out = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks.values():
            x = block(x)
        return self.out(x)


def test_the_summary_stays_small_with_modules_and_efficiency(fresh_tracer, clock) -> None:
    """A single-process summary with every section filled -- TOP_MODULES modules each way,
    efficiency, the counters, the thread split -- stays <= 8 KB (docs/summary.md)."""
    tracer = fresh_tracer(warmup_steps=2, module_sample_s=0.01, clock=clock)
    _train(Wide(clock), 30, clock)
    doc = finish_and_load(tracer)
    path = tracer.path
    assert len(doc["modules"]["forward"]) == len(doc["modules"]["backward"]) == TOP_MODULES
    assert "efficiency" in doc
    size = path.stat().st_size
    assert size <= 8 * 1024, size


def test_at_most_one_step_in_four_is_sampled(fresh_tracer, clock) -> None:
    """However short the period, sampled steps stay a minority: the phases' medians are those
    of unsampled steps."""
    from traceml_ci.tracer.modules import MIN_STEP_GAP

    tracer = fresh_tracer(warmup_steps=2, module_sample_s=0.0001, clock=clock)
    model = Net([1.0, 0.2, 0.2, 0.2], spend_on(clock))  # 3 ms steps: a tick before each
    _train(model, 60, clock)
    doc = finish_and_load(tracer)
    sampled = sum(model.sampled)
    assert doc["modules"]["sampled_steps"] == sampled
    assert 60 // (2 * MIN_STEP_GAP) <= sampled <= 60 // MIN_STEP_GAP + 1, sampled


class Checkpointed(nn.Module):
    """``block`` runs under activation checkpointing: its forward runs again inside backward."""

    def __init__(self, reentrant: bool, clock: FakeClock) -> None:
        super().__init__()
        self.inp = Costly(8, 64, clock)
        self.block = nn.Sequential(Costly(64, 64, clock), nn.ReLU(), Costly(64, 64, clock))
        self.out = Costly(64, 1, clock)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        x = checkpoint(self.block, self.inp(x), use_reentrant=self.reentrant)
        return self.out(x)


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_as_documented(fresh_tracer, clock, reentrant: bool) -> None:
    """Non-reentrant: the block's backward holds its recomputed forward (as the phases count
    it). Reentrant: the block's outputs carry no gradient in the first forward, so it has no
    backward time; the modules around it do. Training is untouched either way."""
    tracer = fresh_tracer(warmup_steps=2, module_sample_s=0.001, clock=clock)
    _train(Checkpointed(reentrant, clock), 30, clock)
    mods = finish_and_load(tracer)["modules"]
    backward = {m["name"] for m in mods["backward"]}
    assert {"inp", "out"} <= backward
    assert ("block" in backward) is not reentrant
    assert "block" in {m["name"] for m in mods["forward"]}


class CallsItsParts(nn.Module):
    """Like a LightningModule whose training step calls its submodules, never ``self(x)``."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(8, 16)
        self.head = nn.Linear(16, 1)


def test_a_model_whose_forward_never_runs_drops_its_hooks_and_says_why(fresh_tracer,
                                                                      clock) -> None:
    from traceml_ci.tracer.modules import MAX_MISSED, MIN_STEP_GAP, OFF_NO_FORWARD

    tracer = fresh_tracer(warmup_steps=1, module_sample_s=0.001, clock=clock)
    model = CallsItsParts()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    # 1 ms steps: a sample is due at every step, armed one step in MIN_STEP_GAP; sampling
    # gives up after MAX_MISSED of them.
    for _ in range(2 + (MAX_MISSED + 1) * MIN_STEP_GAP):
        with traceml.trace_step(model):
            opt.zero_grad()
            ((model.head(model.encoder(x)) - y) ** 2).mean().backward()
            clock.advance(1000.0)
            opt.step()
    assert tracer.module_sampler.off_reason == OFF_NO_FORWARD  # off while training went on
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    doc = finish_and_load(tracer)
    assert doc["modules"] == {"sampled_steps": 0, "off": OFF_NO_FORWARD, "forward": []}
