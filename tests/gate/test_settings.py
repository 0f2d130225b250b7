"""Settings rows (gate/counted/settings.py): a setting that changes cost, compared exactly; the
worse
way regresses naming the setting and its fix, the way back improves, on any clock."""

from __future__ import annotations

import pytest

from tests.gate.summaries import make
from traceml_ci.gate import Status, Verdict, compare
from traceml_ci.gate.results import Evidence

LOADER = {"num_workers": 2, "pin_memory": False, "persistent_workers": False,
          "prefetch_factor": 2, "batch_size": 16, "device": "cpu"}


def with_loader(clock: str = "host", **changes):
    doc = make(clock=clock)
    doc["step_time"]["dataloader"] = dict(LOADER, **changes)
    return doc


def test_fewer_workers_regress_naming_the_setting_and_the_fix_on_a_host_clock():
    c = compare(with_loader(), with_loader(num_workers=0, prefetch_factor=None))
    row = c.row("settings.dataloader.num_workers")
    assert (row.base, row.head, row.status) == (2, 0, Status.REGRESSED)
    assert row.evidence is Evidence.SETTING
    assert row.cause == "DataLoader num_workers 2 → 0"
    assert "raise num_workers" in row.note
    assert c.verdict is Verdict.REGRESSION
    # without workers on one side the worker settings mean nothing: no row for them
    assert c.row("settings.dataloader.prefetch_factor") is None
    assert c.causes[0] == "DataLoader num_workers 2 → 0"


def test_the_way_back_is_improved():
    c = compare(with_loader(num_workers=0), with_loader())
    assert c.row("settings.dataloader.num_workers").status is Status.IMPROVED
    assert c.verdict is Verdict.PASS


@pytest.mark.parametrize(("key", "head", "status"), [
    ("batch_size", 32, Status.REGRESSED),  # neither better nor worse: a change to accept
    ("persistent_workers", True, Status.IMPROVED),
    ("prefetch_factor", 1, Status.REGRESSED),
    ("pin_memory", True, Status.OK),  # no device to copy to: no cost either way
])
def test_each_loader_setting_has_its_direction(key, head, status):
    row = compare(with_loader(), with_loader(**{key: head})).row(f"settings.dataloader.{key}")
    assert row.status is status
    if status is Status.OK:
        assert "no device" in row.note


def test_pinned_memory_turned_off_on_a_device_regresses():
    base = with_loader(clock="device_event", pin_memory=True, device="cuda:0")
    head = with_loader(clock="device_event", pin_memory=False, device="cuda:0")
    row = compare(base, head).row("settings.dataloader.pin_memory")
    assert row.status is Status.REGRESSED and "pin_memory=True" in row.note


def test_unchanged_settings_are_quiet_and_a_summary_without_them_has_no_row():
    c = compare(with_loader(), with_loader())
    rows = [r for r in c.rows if r.name.startswith("settings.")]
    assert rows and all(r.status is Status.OK and not r.note for r in rows)
    assert c.verdict is Verdict.PASS
    older = make(clock="host")
    older["step_time"].pop("dataloader", None)
    assert not [r for r in compare(older, with_loader()).rows if r.name.startswith("settings.")]


#: The sampled step's settings (``counters.settings``) of a plain CPU run.
TORCH = {"anomaly_detection": False, "deterministic_algorithms": False,
         "autograd_profiler": False, "cudnn_benchmark": False, "matmul_precision": "highest",
         "matmul_dtype": "float32", "device": "cpu", "optimizer_foreach": "default",
         "optimizer_fused": "default", "optimizer_capturable": False, "grad_scaler": False,
         "ddp_find_unused_parameters": False, "ddp_static_graph": False,
         "ddp_gradient_as_bucket_view": False, "ddp_bucket_cap_mb": 25.0}


def with_torch(**changes):
    doc = make(clock="host")
    doc.setdefault("counters", {"sampled_step": 1})["settings"] = dict(TORCH, **changes)
    return doc


@pytest.mark.parametrize(("row", "key", "head", "status", "says"), [
    ("torch.anomaly_detection", "anomaly_detection", True, Status.REGRESSED,
     "autograd anomaly detection False → True"),
    ("torch.deterministic_algorithms", "deterministic_algorithms", True, Status.REGRESSED,
     "torch.use_deterministic_algorithms False → True"),
    ("torch.autograd_profiler", "autograd_profiler", True, Status.REGRESSED,
     "the autograd profiler (or emit_nvtx) False → True"),
    ("torch.cudnn_benchmark", "cudnn_benchmark", True, Status.OK, "no device"),
    ("torch.matmul_precision", "matmul_precision", "high", Status.REGRESSED,
     "float32 matmul precision highest → high"),
    ("torch.matmul_dtype", "matmul_dtype", "bfloat16", Status.REGRESSED,
     "the dtype of the step's matrix products float32 → bfloat16"),
    ("torch.grad_scaler", "grad_scaler", True, Status.REGRESSED,
     "a GradScaler around optimizer.step False → True"),
    ("optimizer.foreach", "optimizer_foreach", False, Status.REGRESSED,
     "optimizer foreach default → False"),
    ("optimizer.foreach", "optimizer_foreach", True, Status.OK, "foreach is torch's default"),
    ("optimizer.fused", "optimizer_fused", True, Status.IMPROVED, "optimizer fused"),
    ("ddp.find_unused_parameters", "ddp_find_unused_parameters", True, Status.REGRESSED,
     "DDP find_unused_parameters False → True"),
    ("ddp.static_graph", "ddp_static_graph", True, Status.IMPROVED, "DDP static_graph"),
    ("ddp.gradient_as_bucket_view", "ddp_gradient_as_bucket_view", True, Status.IMPROVED,
     "gradient_as_bucket_view"),
    ("ddp.bucket_cap_mb", "ddp_bucket_cap_mb", 50.0, Status.REGRESSED,
     "DDP bucket_cap_mb 25.0 → 50.0"),
])  # fmt: skip
def test_each_step_setting_has_its_direction_and_its_words(row, key, head, status, says):
    c = compare(with_torch(), with_torch(**{key: head}))
    got = c.row(f"settings.{row}")
    assert got.status is status and says in got.note, got
    assert got.evidence is Evidence.SETTING
    if status is Status.REGRESSED:  # the headline names it, the way back improves or passes
        assert got.cause in c.causes and c.verdict is Verdict.REGRESSION
        back = compare(with_torch(**{key: head}), with_torch()).row(f"settings.{row}")
        assert back.status in (Status.IMPROVED, Status.REGRESSED)  # a plain change either way
        assert back.status is Status.IMPROVED or row in {
            "torch.matmul_precision", "torch.matmul_dtype", "ddp.bucket_cap_mb",
            "torch.grad_scaler"}


def test_a_custom_collate_fn_regresses_and_the_default_back_improves():
    base, head = with_loader(collate_fn="default"), with_loader(collate_fn="mlrepo.data.stack")
    row = compare(base, head).row("settings.dataloader.collate_fn")
    assert row.status is Status.REGRESSED
    assert row.cause == "DataLoader collate_fn default → mlrepo.data.stack"
    assert "default collate" in row.note
    assert compare(head, base).row("settings.dataloader.collate_fn").status is Status.IMPROVED
    # a summary from before collate_fn was recorded: no row
    assert compare(with_loader(), head).row("settings.dataloader.collate_fn") is None
