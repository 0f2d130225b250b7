"""Compute efficiency: the first trace_step (a warmup step) is counted with FlopCounterMode; the
count is the analytic one for an MLP, the rate divides it by the measured compute time."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import traceml_ci as traceml
from tests.summary.builders import record
from tests.tracer.conftest import finish_and_load
from traceml_ci.summary.build import build_summary
from traceml_ci.summary.schema import summary_problems
from traceml_ci.tracer.flops import NOT_COUNTED_COMPILED, NOT_COUNTED_NO_WARMUP

B, IN, HID, OUT = 32, 64, 128, 10
NULLS = ("flops_per_step", "compute_ms", "achieved_tflops", "dtype", "peak_tflops", "mfu_pct")


@pytest.fixture(autouse=True)
def _no_compile_yet(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """Other tests in this process may have compiled (which turns counting off for the whole
    process): these tests count as a fresh process would, except those about compiling."""
    if "compile" in request.node.name:
        return
    from traceml_ci.tracer import flops

    monkeypatch.setattr(flops, "compile_in_use", lambda models=(), frames_before=0: False)


def _train(steps: int, autocast: torch.dtype | None = None) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, OUT))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(B, IN), torch.randn(B, OUT)
    for _ in range(steps):
        with traceml.trace_step(model):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(
                "cpu", dtype=autocast or torch.float32, enabled=autocast is not None
            ):
                out = model(x)
            ((out.float() - y) ** 2).mean().backward()
            opt.step()


def analytic_flops() -> int:
    """2·in·out per sample per linear layer forward; backward computes the weight gradient of
    each layer and the input gradient of all but the first (its input needs none): 2× and 1×."""
    fwd = [2 * B * IN * HID, 2 * B * HID * OUT]
    return fwd[0] + fwd[1] + 2 * fwd[1] + 1 * fwd[0]


def test_the_counted_step_is_the_analytic_count(fresh_tracer) -> None:
    torch.set_num_threads(1)
    tracer = fresh_tracer(warmup_steps=3)
    _train(40)
    doc = finish_and_load(tracer)
    eff = doc["efficiency"]
    assert eff["flops_per_step"] == analytic_flops()
    assert eff["dtype"] == "float32"
    st = doc["step_time"]
    compute = sum(st["phase_ms"][p] for p in ("forward", "backward", "optimizer"))
    assert abs(eff["compute_ms"] - compute) < 1e-3
    expected = analytic_flops() / (compute / 1e3) / 1e12
    assert abs(eff["achieved_tflops"] - expected) <= 0.01 * expected  # the JSON's rounding
    assert eff["mfu_pct"] is None and eff["peak_tflops"] is None  # a CPU: no peak to divide by
    assert st["steps_analyzed"] == 37  # the counted step is a warmup step
    assert summary_problems(doc) == []
    assert len(json.dumps(doc, indent=1).encode()) <= 8 * 1024  # still a small file


def test_under_bf16_autocast_the_dtype_is_the_one_the_matmuls_ran_in(fresh_tracer) -> None:
    """An fp32 model under ``torch.autocast("cpu", dtype=torch.bfloat16)``: its matmuls run in
    bfloat16, forward and backward, so that is the dtype -- not the parameters' float32 -- and
    MFU on a GPU divides by the bfloat16 peak."""
    from traceml_ci.summary.build import _efficiency
    from traceml_ci.summary.peaks import peak_tflops

    tracer = fresh_tracer(warmup_steps=2)
    _train(8, autocast=torch.bfloat16)
    count = tracer.flop_count
    doc = finish_and_load(tracer)
    eff = doc["efficiency"]
    assert eff["dtype"] == "bfloat16"
    assert eff["flops_per_step"] == analytic_flops()  # the same matmuls, in another dtype
    # The same counted step on an H100: the bfloat16 peak, not the float32 one.
    on_gpu = record(
        {"forward": 1.0, "backward": 2.0, "optimizer": 1.0},
        env={"device_name": "NVIDIA H100 80GB HBM3"},
        memory_device="cuda:0",
        flops_per_step=float(count.flops),
        flops_dtype=count.dtype,
    )
    gpu_eff = _efficiency(on_gpu, build_summary(on_gpu).step_time)
    assert gpu_eff is not None
    assert gpu_eff.peak_tflops == peak_tflops("NVIDIA H100", "bfloat16") == 989.0
    expected = analytic_flops() / 4e-3 / 1e12
    assert gpu_eff.mfu_pct is not None
    assert abs(gpu_eff.mfu_pct - 100 * expected / 989.0) < 1e-9


def test_no_warmup_no_count(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=0)
    _train(20)
    doc = finish_and_load(tracer)
    # An analysed step is never slowed by counting: nulls, and why.
    assert doc["efficiency"] == {**dict.fromkeys(NULLS), "not_counted": NOT_COUNTED_NO_WARMUP}


def test_a_counter_that_fails_warns_and_training_goes_on(fresh_tracer, monkeypatch, capfd) -> None:
    from torch.utils import flop_counter

    def broken(self):  # noqa: ANN001
        raise RuntimeError("no counting today")

    monkeypatch.setattr(flop_counter.FlopCounterMode, "__enter__", broken)
    tracer = fresh_tracer(warmup_steps=2)
    _train(20)
    doc = finish_and_load(tracer)
    assert doc["efficiency"]["flops_per_step"] is None
    assert doc["efficiency"]["not_counted"] == "the FLOP counter failed (RuntimeError)"
    assert doc["step_time"]["steps_analyzed"] == 18
    assert capfd.readouterr().err.count("FLOPs not counted") == 1


def test_gpu_peaks_give_mfu() -> None:
    from traceml_ci.summary.peaks import peak_tflops

    assert peak_tflops("NVIDIA H200", "bfloat16") == 989.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "float32") == 19.5
    assert peak_tflops("Intel Xeon", "float32") is None
    assert peak_tflops("NVIDIA T4", "bfloat16") is None  # no bf16 tensor cores


def test_a_process_that_compiles_is_not_counted(fresh_tracer, monkeypatch) -> None:
    """torch.compile in use: counting under compilation could fail the user's step."""
    from traceml_ci.tracer import flops

    monkeypatch.setattr(flops, "compile_in_use", lambda models=(), frames_before=0: True)
    tracer = fresh_tracer(warmup_steps=2)
    _train(10)
    eff = finish_and_load(tracer)["efficiency"]
    assert eff == {**dict.fromkeys(NULLS), "not_counted": NOT_COUNTED_COMPILED}


def test_a_compiled_model_is_seen_as_compiled() -> None:
    from traceml_ci.tracer.flops import compile_in_use, compiled_frames

    before = compiled_frames()  # earlier tests in this process may have compiled: not this run
    plain = nn.Linear(2, 2)
    torch.optim.SGD(plain.parameters(), lr=0.1)  # imports dynamo: no reason on its own
    assert not compile_in_use((plain,), before)
    in_place = nn.Sequential(nn.Linear(2, 2))
    in_place[0].compile()
    assert compile_in_use((torch.compile(nn.Linear(2, 2)),), before)
    assert compile_in_use((in_place,), before)
    # A function compiled and run since the run began counts, whatever the models.
    torch.compile(lambda t: t * 2, backend="eager")(torch.ones(2))
    assert compile_in_use((plain,), before)
    assert not compile_in_use((plain,), compiled_frames())
