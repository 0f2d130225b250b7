"""The CPU reference (tracer/cpuref.py): a fixed workload timed after each analysed step when A/B
mode asks for it; what it leaves of the user's state, and how the job's CPU leaves it out."""

from __future__ import annotations

import time

import torch
from torch import nn

import traceml_ci as traceml
from tests.tracer.conftest import finish_and_load
from traceml_ci.tracer.cpuref import CpuReference
from traceml_ci.tracer.cputime import CpuWindow

WARMUP = 3


def _train(steps: int) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    for _ in range(steps):
        with traceml.trace_step(model):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()


def test_the_workload_leaves_the_users_random_stream_and_grad_mode_alone() -> None:
    warned: list[str] = []
    ref = CpuReference(warned.append)
    rng = torch.get_rng_state()
    expected = torch.rand(3)  # what the user's next draw is
    torch.set_rng_state(rng)
    with torch.no_grad():  # a user's loop may sit under no_grad between steps
        ref.run()
        ref.run()
        assert not torch.is_grad_enabled()
    assert torch.equal(torch.rand(3), expected)
    assert ref.runs == 2 and ref.ms() is not None and ref.ms() > 0 and not warned


def test_a_run_that_asks_for_it_reports_the_reference_one_that_does_not_has_none(
    fresh_tracer, monkeypatch
) -> None:
    monkeypatch.setenv("TRACEML_CI_CPU_REFERENCE", "1")
    tracer = fresh_tracer(warmup_steps=WARMUP)
    assert tracer.cpu_reference is not None
    _train(WARMUP + 20)
    st = finish_and_load(tracer)["step_time"]
    assert tracer.cpu_reference.runs == 20  # once after each analysed step, none in warmup
    assert st["cpu_reference_ms"] > 0 and st["cpu_ms"] > 0
    tracer = fresh_tracer(warmup_steps=WARMUP, max_steps=WARMUP + 4)
    _train(WARMUP + 10)  # steps past max_steps run untraced, and without the workload
    assert tracer.cpu_reference.runs == 4
    finish_and_load(tracer)
    monkeypatch.delenv("TRACEML_CI_CPU_REFERENCE")
    tracer = fresh_tracer(warmup_steps=WARMUP)
    assert tracer.cpu_reference is None
    _train(WARMUP + 5)
    assert "cpu_reference_ms" not in finish_and_load(tracer)["step_time"]


def test_the_job_cpu_window_leaves_out_work_we_ran_on_its_thread() -> None:
    """10 "steps" of ~2 ms CPU each, with 20 ms of our own work on the same thread between
    them: counted, the job's CPU per step would be ~4 ms."""
    ours = [0]
    window = CpuWindow()
    window.ours = lambda: (ours[0], 0)
    window.start()
    job_ns = 0
    for _ in range(10):
        t0 = time.thread_time_ns()
        while time.thread_time_ns() - t0 < 2_000_000:
            pass
        job_ns += time.thread_time_ns() - t0
        t1 = time.thread_time_ns()
        while time.thread_time_ns() - t1 < 2_000_000:
            pass
        ours[0] += time.thread_time_ns() - t1
    window.tick(10)
    got = window.ms_per_step()
    truth = job_ns / 10 / 1e6
    # The process's other threads (torch's, the interpreter's) add a little; ours would add 2 ms.
    assert got is not None and 0.8 * truth <= got <= truth + 0.8, (got, truth)
