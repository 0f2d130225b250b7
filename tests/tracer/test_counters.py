"""Deterministic counters of one sampled warmup step (tracer/counters.py), against analytic
truths: the scalar reads a loop makes and their lines, the optimizer's state, the bytes a loop
keeps from each step, the FLOPs of each layer."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

import traceml_ci as traceml
from tests.tracer.conftest import finish_and_load, marked_line
from traceml_ci.tracer import counters

B, IN, HID, OUT = 8, 16, 32, 4
HERE = os.path.relpath(__file__)


@pytest.fixture(autouse=True)
def _no_compile_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another test in this process may have compiled (which turns the probe off for the
    process): these tests run as a fresh process would."""
    from traceml_ci.tracer import flops

    monkeypatch.setattr(flops, "compile_in_use", lambda models=(), frames_before=0: False)


def _line(marker: str) -> int:
    return marked_line(__file__, marker)


def _zero_change_train(steps: int = 12, *, item: bool = False, keep: list | None = None) -> None:
    """The same loop with no trace_step: steps close at optimizer steps (traceml-ci run)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, OUT))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    x, y = torch.randn(B, IN), torch.randn(B, OUT)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        out = model(x)
        loss = ((out - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        if item:
            loss.item()  # marker:zc-item
        if keep is not None:
            keep.append(out.detach())  # marker:zc-keep


def _train(
    steps: int = 12,
    *,
    opt: str = "sgd",
    item: bool = False,
    keep: list | None = None,
    reads: bool = False,
) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, OUT))
    cls = torch.optim.AdamW if opt == "adamw" else torch.optim.SGD
    optimizer = cls(model.parameters(), lr=0.01)
    x, y = torch.randn(B, IN), torch.randn(B, OUT)
    for _ in range(steps):
        with traceml.trace_step(model):
            optimizer.zero_grad(set_to_none=True)
            out = model(x)  # marker:model
            loss = ((out - y) ** 2).mean()
            loss.backward()
            optimizer.step()
            if item:
                loss.item()  # marker:item
            if keep is not None:
                keep.append(out.detach())  # marker:keep
            if reads:
                bool(loss > 0)  # marker:bool
                float(loss.detach())  # marker:float
                out.tolist()  # marker:tolist
                out[out > 0]  # marker:mask
    return model


def test_a_scalar_read_each_step_is_one_per_step_at_its_line(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=5)
    _train(item=True)
    c = finish_and_load(tracer)["counters"]
    assert c["sampled_step"] == counters.SAMPLED_STEP
    assert c["syncs"] == {
        "per_step": 1,
        "sites": [{"at": f"{HERE}:{_line('marker:item')}", "op": "item", "count": 1}],
    }
    assert torch.Tensor.item is torch._C.TensorBase.item  # the wrapper is gone after the step
    assert "item" not in torch.Tensor.__dict__


def test_no_read_no_sync_and_torch_s_own_host_reads_are_not_counted(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=5)
    _train(opt="adamw")  # AdamW reads its host step counter with .item() inside torch
    assert finish_and_load(tracer)["counters"]["syncs"] == {"per_step": 0, "sites": []}


def test_each_kind_of_read_is_named_at_its_line(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=5)
    _train(reads=True)
    sites = finish_and_load(tracer)["counters"]["syncs"]["sites"]
    got = {(s["op"], s["at"], s["count"]) for s in sites}
    assert got == {
        ("bool", f"{HERE}:{_line('marker:bool')}", 1),
        ("float", f"{HERE}:{_line('marker:float')}", 1),
        ("tolist", f"{HERE}:{_line('marker:tolist')}", 1),
        ("mask index", f"{HERE}:{_line('marker:mask')}", 1),
    }


def _param_bytes() -> int:
    return 4 * (IN * HID + HID + HID * OUT + OUT)


def test_sgd_has_no_state_adamw_two_tensors_per_parameter(fresh_tracer, tmp_path) -> None:
    tracer = fresh_tracer(warmup_steps=5)
    _train()
    sgd = finish_and_load(tracer)["counters"]
    tracer = fresh_tracer(warmup_steps=5, out_dir=tmp_path / "adamw")
    _train(opt="adamw")
    adamw = finish_and_load(tracer)["counters"]
    params = {"tensors": 4, "elements": _param_bytes() // 4, "bytes": _param_bytes()}
    assert sgd["params"] == params and adamw["params"] == params
    assert sgd["optimizer"] == {
        "classes": ["SGD"],
        "param_groups": 1,
        "params": 4,
        "state_tensors_per_param": 0.0,
        "state_bytes": 0,
    }
    assert adamw["optimizer"] == {
        "classes": ["AdamW"],
        "param_groups": 1,
        "params": 4,
        "state_tensors_per_param": 2.0,
        "state_bytes": 2 * _param_bytes(),
    }


def test_a_loop_that_keeps_each_output_retains_its_bytes(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=5)
    kept: list = []
    _train(keep=kept)
    leak = finish_and_load(tracer)["counters"]["leak"]
    assert leak["after_steps"] == counters.LEAK_AFTER_STEPS
    assert leak["retained_bytes_per_step"] == B * OUT * 4  # one float32 output per step
    # The output is the last Linear's addmm, made inside torch's Sequential: the line is the
    # user's call of the model.
    assert leak["top"] == [
        {"op": "addmm", "at": f"{HERE}:{_line('marker:model')}", "bytes": B * OUT * 4}
    ]


def test_a_clean_loop_retains_nothing(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=5)
    _train()
    assert finish_and_load(tracer)["counters"]["leak"]["retained_bytes_per_step"] == 0


def test_flops_by_module_are_each_layers_analytic_count(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=5)
    _train()
    doc = finish_and_load(tracer)
    flops = doc["counters"]["flops"]
    # Forward 2·B·in·out; backward the weight gradient (2×) and, but for the first layer, the
    # input gradient (1× more).
    first, last = 2 * B * IN * HID * 2, 2 * B * HID * OUT * 3
    assert flops == {
        "per_step": first + last,
        "top_modules": [
            {"module": "0", "type": "Linear", "flops": first},
            {"module": "2", "type": "Linear", "flops": last},
        ],
    }
    assert flops["per_step"] == doc["efficiency"]["flops_per_step"]
    assert len(json.dumps(doc["counters"])) < 2048


def test_the_same_code_twice_gives_the_same_counters(fresh_tracer, tmp_path) -> None:
    docs = []
    for run in ("a", "b"):
        tracer = fresh_tracer(warmup_steps=5, out_dir=tmp_path / run)
        _train(item=True, keep=[])
        docs.append(finish_and_load(tracer)["counters"])
    assert docs[0] == docs[1]


def test_too_few_warmup_steps_measure_nothing_and_training_is_untouched(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=1)
    _train(item=True)
    assert "counters" not in finish_and_load(tracer)
    assert tracer.counters.reason == counters.NOT_MEASURED_WARMUP
    assert "item" not in torch.Tensor.__dict__


def test_zero_change_runs_count_flops_and_counters_at_their_own_step_boundaries(
    fresh_tracer,
) -> None:
    """traceml-ci run on a script that never calls trace_step: the FLOP count takes the second
    step and the counters the third (steps close at optimizer steps), with the same figures."""
    tracer = fresh_tracer(zero_change=True, warmup_steps=5)
    kept: list = []
    _zero_change_train(item=True, keep=kept)
    doc = finish_and_load(tracer)
    c = doc["counters"]
    assert c["sampled_step"] == counters.SAMPLED_STEP + 1
    assert c["syncs"] == {
        "per_step": 1,
        "sites": [{"at": f"{HERE}:{_line('marker:zc-item')}", "op": "item", "count": 1}],
    }
    assert c["optimizer"]["classes"] == ["AdamW"] and c["optimizer"]["state_tensors_per_param"] == 2
    # the output kept each step: B x OUT floats
    assert c["leak"]["retained_bytes_per_step"] == B * OUT * 4
    first, last = 2 * B * IN * HID * 2, 2 * B * HID * OUT * 3
    assert c["flops"]["per_step"] == first + last == doc["efficiency"]["flops_per_step"]
    assert [m["module"] for m in c["flops"]["top_modules"]] == ["0", "2"]
    # nothing is left armed: no dispatch mode, no wrapped method, no hook per step
    assert "item" not in torch.Tensor.__dict__
    assert tracer.rec.on_close is None
    assert not torch.utils._python_dispatch._get_current_dispatch_mode_stack()


def test_zero_change_with_too_few_warmup_steps_counts_nothing(fresh_tracer) -> None:
    tracer = fresh_tracer(zero_change=True, warmup_steps=2)
    _zero_change_train(item=True)
    doc = finish_and_load(tracer)
    assert "counters" not in doc
    assert tracer.counters.reason == counters.not_measured_warmup(counters.SAMPLED_STEP + 1)
    assert doc["efficiency"]["flops_per_step"] is not None  # the second step is a warmup one
    assert not torch.utils._python_dispatch._get_current_dispatch_mode_stack()
