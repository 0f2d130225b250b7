"""profile_steps: a few steps after the warmup under torch.profiler -> trace.json, top_ops.json."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import traceml_ci as traceml
from tests.tracer.conftest import finish_and_load
from traceml_ci.summary.profile import ENV_PROFILE_STEPS, read_top_ops
from traceml_ci.tracer.config import TracerConfig, profile_steps_from_env


def _loop(steps: int, *, explicit: bool = True) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        x = torch.randn(16, 32)
        if explicit:
            with traceml.trace_step(model):
                opt.zero_grad()
                model(x).pow(2).mean().backward()
                opt.step()
        else:
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()


def _step_markers(trace: Path) -> list[str]:
    doc = json.loads(trace.read_text())
    return sorted({e["name"] for e in doc["traceEvents"]
                   if str(e.get("name", "")).startswith("ProfilerStep#")})


def test_profiled_steps_after_warmup_give_a_trace_and_top_ops(
    fresh_tracer: Callable[..., Any], tmp_path: Path
) -> None:
    tracer = fresh_tracer(warmup_steps=2, profile_steps=3)
    _loop(12)
    # The profile is written at its last step, while the loop goes on, not at finish.
    prof = tmp_path / "out" / "profile"
    assert (prof / "trace.json").is_file() and tracer.profile is None
    doc = finish_and_load(tracer)
    assert doc["step_time"]["steps_total"] == 12
    assert len(_step_markers(prof / "trace.json")) == 3  # HTA / Perfetto see three steps
    top = read_top_ops(prof / "top_ops.json")
    assert top.steps == 3 and top.device == "cpu"
    names = [o.name for o in top.ops]
    assert {"aten::addmm", "aten::mm"} & set(names)
    assert not any(n.startswith("ProfilerStep") for n in names)
    # Per step: the MLP's two Linear forwards are two addmm calls a step.
    addmm = next(o for o in top.ops if o.name == "aten::addmm")
    assert addmm.calls == pytest.approx(2.0) and addmm.host_self_ms > 0
    assert all(o.device_self_ms is None for o in top.ops)
    assert sum(o.share_pct for o in top.ops) <= 100.0 + 1e-6


def test_a_run_shorter_than_asked_writes_what_was_profiled(
    fresh_tracer: Callable[..., Any], tmp_path: Path
) -> None:
    tracer = fresh_tracer(warmup_steps=2, profile_steps=10)
    _loop(5)
    finish_and_load(tracer)
    assert read_top_ops(tmp_path / "out" / "profile" / "top_ops.json").steps == 3


def test_no_profile_without_a_step_past_warmup_warns(
    fresh_tracer: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tracer = fresh_tracer(warmup_steps=5, profile_steps=2)
    _loop(3)
    finish_and_load(tracer)
    assert not (tmp_path / "out" / "profile" / "top_ops.json").exists()
    assert "no step was profiled" in capsys.readouterr().err


def test_a_failing_profiler_warns_once_and_training_goes_on(
    fresh_tracer: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import torch.profiler

    class Broken:
        def __init__(self, **_: Any) -> None:
            pass

        def start(self) -> None:
            raise RuntimeError("kineto is not available")

    monkeypatch.setattr(torch.profiler, "profile", Broken)
    tracer = fresh_tracer(warmup_steps=1, profile_steps=2)
    _loop(8)
    doc = finish_and_load(tracer)
    assert doc["step_time"]["steps_total"] == 8  # every step still traced
    err = capsys.readouterr().err
    assert err.count("profiling stopped after an error") == 1 and "kineto" in err
    assert not (tmp_path / "out" / "profile").exists()


def test_zero_change_run_profiles_at_optimizer_steps(
    fresh_tracer: Callable[..., Any], tmp_path: Path
) -> None:
    tracer = fresh_tracer(warmup_steps=2, profile_steps=3, zero_change=True)
    _loop(10, explicit=False)
    finish_and_load(tracer)
    top = read_top_ops(tmp_path / "out" / "profile" / "top_ops.json")
    assert top.steps == 3 and "aten::addmm" in [o.name for o in top.ops]
    # The hook is gone once the profile is written: no global optimizer hook left behind.
    from torch.optim.optimizer import _global_optimizer_post_hooks

    assert not _global_optimizer_post_hooks


def test_profile_steps_from_the_environment() -> None:
    assert profile_steps_from_env(None) == 0
    assert profile_steps_from_env(" 4 ") == 4
    assert profile_steps_from_env("x") == 0 and profile_steps_from_env("-3") == 0
    with pytest.raises(ValueError, match="profile_steps"):
        TracerConfig(profile_steps=-1)


def test_off_by_default_the_profiling_module_is_never_imported(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import os, sys
        os.environ.pop({ENV_PROFILE_STEPS!r}, None)
        import torch
        from torch import nn
        import traceml_ci as traceml
        traceml.init(out_dir={str(tmp_path)!r}, warmup_steps=1, live=False)
        m = nn.Linear(4, 1)
        for _ in range(4):
            with traceml.trace_step(m):
                m(torch.randn(2, 4)).sum().backward()
        traceml.finish()
        print("traceml_ci.tracer.profiling" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"
    assert not (tmp_path / "profile").exists()
