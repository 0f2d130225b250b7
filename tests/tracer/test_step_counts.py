"""What a step does, counted on the sampled step (tracer/counters.py), against analytic truths:
the ATen ops a loop runs by kind and the line that ran them, and the settings the code gave torch
that change a step's cost (docs/gate.md, "The counters")."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import traceml_ci as traceml
from tests.tracer.conftest import finish_and_load, marked_line
from traceml_ci.gate import Status, Verdict, compare

B, IN, HID, OUT = 8, 16, 32, 4
HERE = os.path.relpath(__file__)


@pytest.fixture(autouse=True)
def _no_compile_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    from traceml_ci.tracer import flops

    monkeypatch.setattr(flops, "compile_in_use", lambda models=(), frames_before=0: False)


def _line(marker: str) -> int:
    return marked_line(__file__, marker)


def _train(steps: int = 10, *, fills: int = 0, set_to_none: bool = True,
           foreach: bool | None = False, autocast: bool = False,
           model: nn.Module | None = None) -> None:
    torch.manual_seed(0)
    model = model or nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, OUT))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, foreach=foreach)
    x, y = torch.randn(B, IN), torch.randn(B, OUT)
    scratch = torch.zeros(4)
    for _ in range(steps):
        with traceml.trace_step(model):
            optimizer.zero_grad(set_to_none=set_to_none)  # marker:zero_grad
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = model(x)
            loss = ((out.float() - y) ** 2).mean()
            loss.backward()
            optimizer.step()
            for _ in range(fills):
                scratch.fill_(1.0)  # marker:fill


def _counters(fresh_tracer: Any, out_dir: Any, **train: Any) -> dict[str, Any]:
    tracer = fresh_tracer(warmup_steps=5, out_dir=out_dir)
    _train(**train)
    return finish_and_load(tracer)["counters"]


def _kind(ops: dict[str, Any], op: str) -> tuple[int, str]:
    count, site = ops["kinds"][op]
    return count, ops["sites"][site]


def test_n_fills_a_step_are_n_fill_ops_at_their_line(fresh_tracer, tmp_path) -> None:
    none = _counters(fresh_tracer, tmp_path / "none")["ops"]
    seven = _counters(fresh_tracer, tmp_path / "seven", fills=7)["ops"]
    assert "fill_" not in none["kinds"]
    assert _kind(seven, "fill_") == (7, f"{HERE}:{_line('marker:fill')}")
    assert seven["per_step"] - none["per_step"] == 7  # nothing else moved
    assert sum(n for n, _ in seven["kinds"].values()) + seven["other"] == seven["per_step"]


def test_zero_grad_without_set_to_none_zeroes_each_gradient_at_its_line(
        fresh_tracer, tmp_path) -> None:
    ops = _counters(fresh_tracer, tmp_path / "zero", set_to_none=False)["ops"]
    # four parameters, a per-parameter zero_ each (foreach=False), at the user's zero_grad
    assert _kind(ops, "zero_") == (4, f"{HERE}:{_line('marker:zero_grad')}")
    none = _counters(fresh_tracer, tmp_path / "none")["ops"]
    assert "zero_" not in none["kinds"]


def test_the_same_code_twice_runs_the_same_ops(fresh_tracer, tmp_path) -> None:
    a = _counters(fresh_tracer, tmp_path / "a", fills=2)
    b = _counters(fresh_tracer, tmp_path / "b", fills=2)
    assert a["ops"] == b["ops"] and a["settings"] == b["settings"]


def test_the_gate_names_the_added_ops_their_line_and_the_guides_fix(
        fresh_tracer, tmp_path) -> None:
    docs = {}
    for name, kw in (("base", {}), ("head", {"set_to_none": False})):
        tracer = fresh_tracer(warmup_steps=5, out_dir=tmp_path / name)
        _train(**kw)
        docs[name] = finish_and_load(tracer)
    c = compare(docs["base"], docs["head"])
    row = c.row("counters.ops_per_step")
    assert row.status is Status.REGRESSED and c.verdict is Verdict.REGRESSION
    assert f"+4 zero_ per step at {HERE}:{_line('marker:zero_grad')}" in row.note
    assert "set_to_none=True" in row.note
    # the fix applied: fewer ops, improved
    back = compare(docs["head"], docs["base"]).row("counters.ops_per_step")
    assert back.status is Status.IMPROVED


def test_settings_are_read_as_the_code_set_them(fresh_tracer, tmp_path) -> None:
    plain = _counters(fresh_tracer, tmp_path / "plain")["settings"]
    assert plain == {
        "anomaly_detection": False, "deterministic_algorithms": False,
        "autograd_profiler": False, "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "matmul_precision": torch.get_float32_matmul_precision(), "device": "cpu",
        "optimizer_foreach": False, "optimizer_fused": "default",  # SGD has no capturable
        "matmul_dtype": "float32", "grad_scaler": False,
    }
    with torch.autograd.set_detect_anomaly(True):
        anomaly = _counters(fresh_tracer, tmp_path / "anomaly")["settings"]
    assert anomaly["anomaly_detection"] is True
    torch.use_deterministic_algorithms(True)
    try:
        det = _counters(fresh_tracer, tmp_path / "det")["settings"]
    finally:
        torch.use_deterministic_algorithms(False)
    assert det["deterministic_algorithms"] is True
    left = _counters(fresh_tracer, tmp_path / "left", foreach=None)["settings"]
    assert left["optimizer_foreach"] == "default"
    bf16 = _counters(fresh_tracer, tmp_path / "bf16", autocast=True)["settings"]
    assert bf16["matmul_dtype"] == "bfloat16"  # the Linear layers ran under autocast


def test_ddp_settings_are_read_from_the_traced_model(fresh_tracer, tmp_path) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = DDP(nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, OUT)),
                    find_unused_parameters=True, bucket_cap_mb=5)
        settings = _counters(fresh_tracer, tmp_path / "ddp", model=model)["settings"]
    finally:
        dist.destroy_process_group()
    assert settings["ddp_find_unused_parameters"] is True
    assert settings["ddp_static_graph"] is False
    assert settings["ddp_gradient_as_bucket_view"] is False
    assert settings["ddp_bucket_cap_mb"] == 5.0


def stack_pairs(batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, ...]:
    """A hand-written collate_fn."""
    return torch.stack([x for x, _ in batch]), torch.stack([y for _, y in batch])


@pytest.mark.parametrize(("collate", "name"), [(None, "default"),
                                               (stack_pairs, f"{__name__}.stack_pairs")])
def test_a_dataloaders_collate_fn_is_named(fresh_tracer, collate, name) -> None:
    tracer = fresh_tracer(warmup_steps=2)
    data = TensorDataset(torch.randn(32, IN), torch.randn(32, OUT))
    model = nn.Linear(IN, OUT)
    for x, _ in DataLoader(data, batch_size=4, collate_fn=collate):
        with traceml.trace_step(model):
            model(x)
    assert finish_and_load(tracer)["step_time"]["dataloader"]["collate_fn"] == name
