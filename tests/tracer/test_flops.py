"""Compute efficiency: the first trace_step (a warmup step) is counted with FlopCounterMode; the
count is the analytic one for an MLP, the rate divides it by the measured compute time."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import traceml_ci as traceml
from tests.summary.builders import record
from tests.tracer.conftest import finish_and_load
from traceml_ci.summary.build import build_summary
from traceml_ci.summary.io import summary_text
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
    assert len(summary_text(doc).encode()) <= 8 * 1024  # still a small file


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


# -- FLOPs by module: each op to the module whose own code ran it ---------------------------------


class _Mixer(nn.Module):
    """A module with an op of its own (``x @ mix``) before its child's."""

    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Parameter(torch.randn(HID, HID) / HID)
        self.proj = nn.Linear(HID, HID)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x @ self.mix)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(HID, HID), nn.ReLU(), nn.Linear(HID, HID)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class _Net(nn.Module):
    """Linear, a block (checkpointed or not), Linear."""

    def __init__(self, checkpoint: str | None) -> None:
        super().__init__()
        self.inp, self.block, self.out = nn.Linear(IN, HID), _Block(), nn.Linear(HID, OUT)
        self.checkpoint = checkpoint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        h = self.inp(x)
        if self.checkpoint is None:
            h = self.block(h)
        else:
            h = checkpoint(self.block, h, use_reentrant=self.checkpoint == "reentrant")
        return self.out(h)


def _counted(fresh_tracer, model: nn.Module) -> dict:
    """The summary's ``counters.flops`` of a few traced SGD steps of ``model``."""
    tracer = fresh_tracer(warmup_steps=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(1)
    x, y = torch.randn(B, IN), torch.randn(B, OUT)
    for _ in range(5):
        with traceml.trace_step(model):
            opt.zero_grad(set_to_none=True)
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
    return finish_and_load(tracer)["counters"]["flops"]


def _linear(n_in: int, n_out: int, times: int) -> int:
    """A linear layer's FLOPs: forward 2·B·in·out, then ``times`` - 1 gradients as large."""
    return times * 2 * B * n_in * n_out


def test_a_dropout_that_passes_its_input_on_gets_no_flops(fresh_tracer) -> None:
    """Issue 31: Dropout(p=0) returns its input; torch's module tracker kept it "entered" in
    backward while the first Linear's gradients ran, and gave it their FLOPs."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, HID), nn.Dropout(p=0.0), nn.Linear(HID, OUT))
    flops = _counted(fresh_tracer, model)
    first, last = _linear(IN, HID, 2), _linear(HID, OUT, 3)  # the input needs no gradient
    assert flops == {
        "per_step": first + last,
        "top_modules": [
            {"module": "0", "type": "Linear", "flops": first},
            {"module": "2", "type": "Linear", "flops": last},
        ],
    }


def test_a_modules_own_op_is_its_own_beside_its_childs(fresh_tracer) -> None:
    """A module that multiplies before calling its child: that matmul (forward, both gradients)
    is the module's, its child's are the child's -- not all of it the child's, nor dropped for
    not being a leaf."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, HID), _Mixer(), nn.Linear(HID, OUT))
    flops = _counted(fresh_tracer, model)
    first, mix, proj, last = (_linear(IN, HID, 2), _linear(HID, HID, 3), _linear(HID, HID, 3),
                              _linear(HID, OUT, 3))
    assert flops["per_step"] == first + mix + proj + last
    assert sorted((m["module"], m["type"], m["flops"]) for m in flops["top_modules"]) == [
        ("0", "Linear", first),
        ("1", "_Mixer", mix),
        ("1.proj", "Linear", proj),
        ("2", "Linear", last),
    ]


@pytest.mark.parametrize(("checkpoint", "again"), [("reentrant", 2), ("non-reentrant", 1)])
def test_a_checkpointed_blocks_recomputed_forward_is_counted_apart(
    fresh_tracer, checkpoint: str, again: int
) -> None:
    """Activation checkpointing runs the block's forward again in backward: those FLOPs are the
    step's, said as recomputation of the block, and each module's own figure is what it is
    without checkpointing (not a Dropout's or a neighbour's). Reentrant checkpointing runs the
    whole block again; non-reentrant stops once the tensors backward needs are back (torch's
    early stop): fc1 and the ReLU, whose output fc2 saved, not fc2."""
    torch.manual_seed(0)
    plain = _counted(fresh_tracer, _Net(None))
    torch.manual_seed(0)
    flops = _counted(fresh_tracer, _Net(checkpoint))
    recomputed = again * _linear(HID, HID, 1)  # the block's Linears, forward once more
    assert flops["top_modules"] == plain["top_modules"]
    assert {m["module"] for m in plain["top_modules"]} == {"inp", "block.fc1", "block.fc2", "out"}
    assert flops["per_step"] == plain["per_step"] + recomputed
    assert "recomputed" not in plain
    assert flops["recomputed"] == {
        "per_step": recomputed,
        "top_modules": [{"module": "block", "type": "_Block", "flops": recomputed}],
    }


def test_counting_by_module_leaves_no_hook_behind(fresh_tracer) -> None:
    from torch.nn.modules import module as torch_module

    before = (dict(torch_module._global_forward_pre_hooks),
              dict(torch_module._global_forward_hooks))
    torch.manual_seed(0)
    _counted(fresh_tracer, _Net("non-reentrant"))
    assert (torch_module._global_forward_pre_hooks, torch_module._global_forward_hooks) == before
    assert not torch_module._global_forward_hooks_always_called


def test_attribution_that_fails_never_reaches_the_step(fresh_tracer, monkeypatch) -> None:
    """A module hook of the count that raises leaves that module unattributed; the step runs,
    the total is whole, and the hooks still go."""
    from torch.nn.modules import module as torch_module

    from traceml_ci.tracer.flops import ModuleAttribution

    def broken(self, *args):  # noqa: ANN001
        raise RuntimeError("no tagging today")

    monkeypatch.setattr(ModuleAttribution, "_tag", broken)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, OUT))
    flops = _counted(fresh_tracer, model)
    first, last = _linear(IN, HID, 2), _linear(HID, OUT, 3)
    assert flops["per_step"] == first + last
    # forwards still the modules' own; the backward ops, their nodes untagged, are nobody's
    assert flops["top_modules"] == [
        {"module": "0", "type": "Linear", "flops": _linear(IN, HID, 1)},
        {"module": "2", "type": "Linear", "flops": _linear(HID, OUT, 1)},
    ]
    assert not torch_module._global_forward_pre_hooks and not torch_module._global_forward_hooks
