"""The loops users actually write: accumulation, AMP skips, compile, no DataLoader, GANs, break.

Where a test checks the tracer's rules (what counts to which phase), its loop spends fake time
(``fakes.FakeClock``) and the figures are exact; where it checks timing against reality, it
spins and compares with a stopwatch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import traceml_ci as traceml
from tests.tracer.conftest import finish_and_load, pct
from tests.tracer.fakes import FakeClock
from tests.tracer.loops import (
    BusyModel,
    BusySGD,
    assert_matches_stopwatch,
    busy_loader,
    spend_on,
    stopwatch_loop,
)


def _phase_ms(doc: dict) -> dict[str, float]:
    return doc["step_time"]["phase_ms"]


def test_gradient_accumulation_counts_every_micro_batch(fresh_tracer) -> None:
    clock = FakeClock()
    spend = spend_on(clock)
    tracer = fresh_tracer(warmup_steps=1, clock=clock)
    model = BusyModel(forward_ms=2.0, backward_ms=1.5, spend=spend)
    optimizer = BusySGD(model.parameters(), step_ms=2.5, spend=spend)
    k = 4
    batches = iter(busy_loader(12 * k, 0.5, spend=spend))
    for _ in range(12):
        with traceml.trace_step(model):
            optimizer.zero_grad()
            for _ in range(k):
                x, y = next(batches)  # fetched inside the step
                (((model(x) - y) ** 2).mean() / k).backward()
            optimizer.step()
    doc = finish_and_load(tracer)
    assert doc["step_time"]["steps_total"] == 12
    # Every micro-batch's fetch, forward and backward, not just the first one's.
    assert _phase_ms(doc) == {"dataloader": k * 0.5, "forward": k * 2.0, "backward": k * 1.5,
                              "optimizer": 2.5, "other": 0.0}


def _scaler_loop(trace: bool, steps: int = 14) -> tuple[nn.Module, int]:
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    skipped = 0
    for i in range(steps):
        ctx = traceml.trace_step(model) if trace else _null()
        with ctx:
            optimizer.zero_grad()
            loss = model(torch.randn(4, 8)).sum()
            if i % 2:
                loss = loss * float("inf")  # overflow: the scaler skips optimizer.step()
            scaler.scale(loss).backward()
            before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            skipped += scaler.get_scale() < before
    return model, skipped


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


def test_grad_scaler_skipping_optimizer_step_still_counts_steps(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=0)
    _, skipped = _scaler_loop(trace=True)
    assert skipped == 7
    doc = finish_and_load(tracer)
    assert doc["step_time"]["steps_total"] == 14
    assert doc["step_time"]["optimizer_pct"] is not None


def test_grad_scaler_skips_are_step_boundaries_in_zero_change_mode(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=0, zero_change=True)
    _scaler_loop(trace=False)
    doc = finish_and_load(tracer)
    assert doc["run"]["mode"] == "zero-change"
    assert doc["step_time"]["steps_total"] == 14


class _Net(nn.Module):
    # A user-defined module: dynamo skips torch's own nn classes as top frames.
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("style", ["torch.compile", "module.compile", "inner traced"])
def test_compiled_model_has_no_graph_breaks(fresh_tracer, style: str) -> None:
    """A compiled model compiles as it does untraced: one frame, no graph break, also with
    ``fullgraph=True`` -- and when the model traced is the one ``torch.compile`` wrapped
    ("inner traced": the wrapper called in the step), whose first call falls in the step
    the FLOP count's dispatch mode is armed on (under one, dynamo skips a frame for good)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    tracer = fresh_tracer(warmup_steps=1)
    net = _Net()
    if style == "module.compile":
        net.compile(backend="eager", fullgraph=True)
        model = traced = net
    else:
        model = torch.compile(net, backend="eager", fullgraph=True)
        traced = net if style == "inner traced" else model
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    for _ in range(8):
        with traceml.trace_step(traced):
            optimizer.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert "forward" not in net.__dict__
    doc = finish_and_load(tracer)
    assert doc["step_time"]["phase_ms"]["forward"] > 0
    assert doc["step_time"]["steps_total"] == 8


def test_loop_without_dataloader(fresh_tracer) -> None:
    clock = FakeClock()
    spend = spend_on(clock)
    tracer = fresh_tracer(warmup_steps=1, clock=clock)
    model = BusyModel(1.0, 1.5, spend=spend)
    optimizer = BusySGD(model.parameters(), 0.5, spend=spend)
    data = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(12)]
    for x, y in data:
        with traceml.trace_step(model):
            optimizer.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            optimizer.step()
    doc = finish_and_load(tracer)
    assert _phase_ms(doc) == {"dataloader": 0.0, "forward": 1.0, "backward": 1.5,
                              "optimizer": 0.5, "other": 0.0}
    assert pct(doc, "dataloader") == 0.0


def test_two_models_and_two_optimizers_in_one_step(fresh_tracer) -> None:
    clock = FakeClock()
    spend = spend_on(clock)
    tracer = fresh_tracer(warmup_steps=1, clock=clock)
    gen, disc = BusyModel(2.0, 0.5, spend=spend), BusyModel(1.0, 0.25, spend=spend)
    opt_g = BusySGD(gen.parameters(), 0.75, spend=spend)
    opt_d = BusySGD(disc.parameters(), 1.25, spend=spend)
    for _ in range(12):
        with traceml.trace_step(gen, disc):
            opt_d.zero_grad()
            disc(torch.randn(4, 8)).mean().backward()
            opt_d.step()
            opt_g.zero_grad()
            fake = gen(torch.randn(4, 8)).expand(4, 8)
            disc(fake).mean().backward()  # through disc, then gen
            opt_g.step()
    doc = finish_and_load(tracer)
    assert _phase_ms(doc) == {
        "dataloader": 0.0,
        "forward": 1.0 + 2.0 + 1.0,  # disc, gen, disc(fake): both models' forwards
        "backward": 0.25 + (0.25 + 0.5),
        "optimizer": 1.25 + 0.75,  # both optimizers
        "other": 0.0,
    }


def test_break_out_of_the_loop_leaves_nothing_open(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=0)
    model = BusyModel(0.5, 0.5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for i, (x, y) in enumerate(busy_loader(50, 0.5)):
        with traceml.trace_step(model):
            optimizer.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            optimizer.step()
            if i == 6:
                break
    assert tracer.rec.in_step == 0 and tracer.rec.active == -1
    assert "forward" not in model.__dict__
    doc = finish_and_load(tracer)
    assert doc["step_time"]["steps_total"] == 7


def test_nested_trace_step_counts_one_step(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=0)
    model = BusyModel(0.0, 0.0)
    with traceml.trace_step(model), traceml.trace_step(model):
        model(torch.randn(2, 8))
    assert tracer.store.steps_total == 1
    assert "forward" not in model.__dict__


def test_activation_checkpointing_forward_inside_backward_counts_as_backward(fresh_tracer) -> None:
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = BusyModel(3.0, 0.5, spend=spend)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint(self.inner, x, use_reentrant=False)

    clock = FakeClock()
    spend = spend_on(clock)
    tracer = fresh_tracer(warmup_steps=1, clock=clock)
    model = Checkpointed()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(8):
        with traceml.trace_step(model):
            optimizer.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
    # The recomputed forward runs inside backward: it is backward time, counted once.
    doc = finish_and_load(tracer)
    assert _phase_ms(doc) == {"dataloader": 0.0, "forward": 3.0, "backward": 3.0 + 0.5,
                              "optimizer": 0.0, "other": 0.0}


def test_time_outside_named_phases_is_other(fresh_tracer) -> None:
    clock = FakeClock()
    spend = spend_on(clock)
    tracer = fresh_tracer(warmup_steps=1, clock=clock)
    model = BusyModel(1.0, 1.0, spend=spend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(12):
        with traceml.trace_step(model):
            optimizer.zero_grad()
            loss = model(torch.randn(4, 8)).sum()
            loss.backward()
            optimizer.step()
            spend(6.0)  # logging / metrics / host syncs
    doc = finish_and_load(tracer)
    assert doc["step_time"]["diagnosis"] == "OVERHEAD_BOUND"
    assert _phase_ms(doc) == {"dataloader": 0.0, "forward": 1.0, "backward": 1.0,
                              "optimizer": 0.0, "other": 6.0}
    assert doc["step_time"]["other_pct"] == 75.0


def test_dataloader_with_worker_processes(fresh_tracer) -> None:
    from torch.utils.data import DataLoader

    from tests.tracer.loops import BusyDataset

    tracer = fresh_tracer(warmup_steps=2)
    model = BusyModel(0.5, 0.5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(BusyDataset(64), batch_size=4, num_workers=2)
    watch, _ = stopwatch_loop(model, optimizer, iter(loader), 16)
    assert_matches_stopwatch(tracer, watch, ("dataloader",))
    assert finish_and_load(tracer)["step_time"]["steps_total"] == 16


def test_fetches_from_another_thread_are_not_the_training_loop(fresh_tracer) -> None:
    import threading

    clock = FakeClock()
    spend = spend_on(clock)
    tracer = fresh_tracer(warmup_steps=0, clock=clock)
    model = BusyModel(1.0, 0.0, spend=spend)
    prefetched = []
    loader_iter = iter(busy_loader(8, 5.0, spend=spend))
    thread = threading.Thread(target=lambda: prefetched.extend(loader_iter))
    thread.start()
    thread.join()
    for x, _ in prefetched:
        with traceml.trace_step(model):
            model(x)
    phase_ms = finish_and_load(tracer)["step_time"]["phase_ms"]
    assert phase_ms == {"dataloader": 0.0, "forward": 1.0, "backward": 0.0, "optimizer": 0.0,
                        "other": 0.0}


def test_lr_scheduler_created_before_init_still_times_the_optimizer(
    tmp_path, torch_single_thread
) -> None:
    from traceml_ci.tracer import api
    from traceml_ci.tracer.config import TracerConfig

    clock = FakeClock()
    spend = spend_on(clock)
    model = BusyModel(0.5, 0.5, spend=spend)
    optimizer = BusySGD(model.parameters(), step_ms=2.0, spend=spend)
    # The scheduler wraps optimizer.step with the function it finds now, before tracing starts.
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5)
    tracer = api.start(TracerConfig(out_dir=tmp_path, warmup_steps=1), at_exit=False,
                       clock=clock)
    try:
        for x, y in busy_loader(10, 0.25, spend=spend):
            with traceml.trace_step(model):
                optimizer.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                optimizer.step()
            scheduler.step()
        phase_ms = finish_and_load(tracer)["step_time"]["phase_ms"]
        assert phase_ms == {"dataloader": 0.25, "forward": 0.5, "backward": 0.5,
                            "optimizer": 2.0, "other": 0.0}
    finally:
        api.stop()


def test_optimizers_created_after_init_need_no_global_hooks(tmp_path) -> None:
    # A fresh process: in this one, earlier tests have instantiated optimizer classes already.
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            from torch.optim import optimizer as optim_mod
            import traceml_ci as traceml

            tracer = traceml.init(out_dir=r"OUT", warmup_steps=0)
            model = torch.nn.Linear(4, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(6):
                with traceml.trace_step(model):
                    opt.zero_grad()
                    model(torch.randn(8, 4)).sum().backward()
                    opt.step()
            hooks = len(optim_mod._global_optimizer_pre_hooks)
            traceml.finish()
            tracer.patches.uninstall()
            # Instantiated while installed: torch's own hooked step stays, as torch left it.
            print(hooks, getattr(torch.optim.SGD.step, "hooked", False),
                  getattr(torch.optim.Adam.step, "hooked", False))
            """
        ).replace("OUT", str(tmp_path / "out"))
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["0", "True", "False"]
    doc = json.loads((tmp_path / "out" / "final_summary.json").read_text())
    assert doc["step_time"]["steps_total"] == 6
    assert doc["step_time"]["phase_ms"]["optimizer"] > 0
