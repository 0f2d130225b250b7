"""The h2d phase: host-to-device copies inside a step (tracer/copies.py).

This machine has no accelerator, so the copies go through the same code path with the CPU
playing the device (``CopyPatches(is_device=...)``, copies made with ``.to("cpu", copy=True)``
and ``copy_``): timed against a stopwatch on the host clock, and with fake CUDA events. The
copies are torch's own work (the op the patches time), not a cost a test could spend on a fake
clock: these stay on the real clock, step by step against a stopwatch."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch import nn

import traceml_ci as traceml
from tests.tracer.conftest import finish_and_load
from tests.tracer.loops import Stopwatch
from traceml_ci.summary.stats import median
from traceml_ci.tracer.copies import CopyPatches
from traceml_ci.tracer.steps import PHASE_COLS

#: Floats in the "batch" each step copies: ~16 MB, a few ms per copy on this machine.
BATCH_FLOATS = 4_000_000
STEPS = 16


def cpu_plays_device(tracer: Any) -> CopyPatches:
    """The tracer's copy patches with the CPU as the device: a copy to "cpu" that makes a new
    tensor is a host-to-device copy. Set before the first step (a device run installs it then);
    installed here for a CPU run, which never installs it itself."""
    tracer.copies = CopyPatches(tracer.rec, tracer.fail, is_device=lambda d: d.type == "cpu")
    return tracer.copies


def _loop(model: nn.Module, optimizer: Any, steps: int, *, copy_into: bool = False,
          extra: Any = None) -> Stopwatch:
    """The README loop with the batch copied "to the device" inside the step, on a stopwatch:
    ``.to(device, copy=True)``, or ``copy_`` into a preallocated buffer."""
    watch = Stopwatch()
    host = torch.randn(BATCH_FLOATS)
    buf = torch.empty(BATCH_FLOATS)
    for _ in range(steps):
        watch.new_step()
        watch.steps[-1]["h2d"] = 0.0
        with traceml.trace_step(model):
            if copy_into:
                xb = watch.time("h2d", buf.copy_, host)
            else:
                xb = watch.time("h2d", host.to, "cpu", copy=True)
            if extra is not None:
                extra(host)
            x = xb[:64].view(4, 16)
            optimizer.zero_grad(set_to_none=True)
            loss = watch.time("forward", model, x).pow(2).mean()
            watch.time("backward", loss.backward)
            watch.time("optimizer", optimizer.step)
    return watch


def _assert_h2d_matches(tracer: Any, watch: Stopwatch, doc: dict[str, Any]) -> None:
    skip = tracer.store.warmup_steps
    traced = tracer.store.column(PHASE_COLS["h2d"])
    truth = watch.column("h2d", skip)
    assert len(traced) == len(truth) == STEPS - skip
    # Step by step within 0.3 ms on most steps (a preemption between the two clocks' marks
    # may hit one step), against copies of several ms.
    assert median(truth) > 0.5
    assert median([abs(a - b) for a, b in zip(traced, truth, strict=True)]) < 0.3
    # The summary is the traced column's median (a loaded runner spreads the steps, so the
    # two medians of 14 steps may sit apart although most steps agree: compare like with like).
    st = doc["step_time"]
    assert st["phase_ms"]["h2d"] == pytest.approx(median(traced), abs=1e-3)
    assert st["h2d_pct"] > 0
    assert sum(st[f"{p}_pct"] for p in ("dataloader", "h2d", "forward", "backward",
                                        "optimizer", "other")) == pytest.approx(100, abs=0.1)


@pytest.mark.parametrize("copy_into", [False, True], ids=["to", "copy_"])
def test_h2d_matches_a_stopwatch_on_the_host_clock(fresh_tracer, copy_into: bool) -> None:
    tracer = fresh_tracer(warmup_steps=2)
    cpu_plays_device(tracer).install()
    model = nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    watch = _loop(model, optimizer, STEPS, copy_into=copy_into)
    doc = finish_and_load(tracer)
    assert doc["step_time"]["clock"] == "host"
    _assert_h2d_matches(tracer, watch, doc)
    assert torch.Tensor.to is torch._C.TensorBase.to  # finish put torch back as it was


def test_what_is_not_a_host_to_device_copy_stays_out_of_h2d(fresh_tracer) -> None:
    """A dtype cast, a copy made outside a step or on another thread: none of them is h2d."""
    tracer = fresh_tracer(warmup_steps=0)
    copies = cpu_plays_device(tracer)
    copies.install()
    host = torch.randn(BATCH_FLOATS)
    host.to("cpu", copy=True)  # before any step
    model = nn.Linear(16, 4)

    def cast_and_thread(x: torch.Tensor) -> None:
        x.to(torch.float64)  # a cast names no device
        worker = threading.Thread(target=lambda: x.to("cpu", copy=True))
        worker.start()
        worker.join()

    with traceml.trace_step(model):
        cast_and_thread(host)
    assert not copies.seen
    assert tracer.rec.acc[PHASE_COLS["h2d"] - 1] == 0
    with traceml.trace_step(model):
        host.to(device="cpu", copy=True)
    assert copies.seen


def test_a_run_without_copies_keeps_the_summary_without_h2d(fresh_tracer) -> None:
    """A CPU run has no device to copy to: the patches are never installed, ``.to`` is torch's
    own, and the summary has no h2d key (like a single process and the wait phase)."""
    tracer = fresh_tracer(warmup_steps=2)
    model = nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(12):
        x = torch.randn(4, 16)
        with traceml.trace_step(model):
            x = x.to("cpu")
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
    assert not tracer.copies.installed
    assert torch.Tensor.to is torch._C.TensorBase.to
    doc = finish_and_load(tracer)
    st = doc["step_time"]
    assert "h2d_pct" not in st and "h2d" not in st["phase_ms"]
    noise = (st.get("noise") or {}).get("pct") or {}  # none: too few windows for a figure
    assert "h2d" not in noise


def test_a_device_run_times_copies_with_device_events(fresh_tracer, fake_cuda) -> None:
    """On a device clock the copy's marks are (fake) CUDA events, recorded around it on the
    current stream and resolved later: the h2d phase still matches the stopwatch, and the host
    never synchronised per step."""
    log, _ = fake_cuda
    tracer = fresh_tracer(warmup_steps=2)
    cpu_plays_device(tracer)  # the device run installs it at its first step
    model = nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    watch = _loop(model, optimizer, STEPS)
    assert tracer.copies.installed
    assert log.syncs == 0
    doc = finish_and_load(tracer)
    assert doc["step_time"]["clock"] == "device_event"
    _assert_h2d_matches(tracer, watch, doc)


def test_a_device_run_installs_the_copy_patches_at_its_first_step(fresh_tracer, fake_cuda) -> None:
    tracer = fresh_tracer(warmup_steps=0)
    assert not tracer.copies.installed
    model = nn.Linear(16, 4)
    with traceml.trace_step(model):
        pass
    assert tracer.copies.installed
    assert torch.Tensor.to is not torch._C.TensorBase.to
    tracer.finish()
    assert torch.Tensor.to is torch._C.TensorBase.to
