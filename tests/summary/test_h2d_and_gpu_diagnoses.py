"""The h2d phase in a summary (H2D_BOUND, the H2D straggler) and the diagnoses of what the GPU
sampler and the ranks' memory peaks show (LOW_GPU_UTILIZATION, HIGH_GPU_TEMPERATURE,
RANK_GPU_MEMORY_IMBALANCE), on handmade summaries and a fake pynvml."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from tests.gate.summaries import make
from tests.summary.builders import record, summary_doc
from traceml_ci.summary.build import build_summary
from traceml_ci.summary.diagnose import HIGH_GPU_TEMPERATURE, LOW_GPU_UTILIZATION, diagnose_gpu
from traceml_ci.summary.keys import ALL_PHASES
from traceml_ci.summary.model import DataLoaderSettings, GpuUtil
from traceml_ci.summary.ranks import (
    H2D_STRAGGLER,
    RANK_GPU_MEMORY_IMBALANCE,
    merge_ranks,
)
from traceml_ci.summary.schema import summary_problems
from traceml_ci.summary.thresholds import DEFAULT_THRESHOLDS as TH

OWN = {"dataloader": 1.0, "forward": 4.0, "backward": 4.0, "optimizer": 1.0}


def kinds(doc: dict[str, Any], area: str) -> list[str]:
    return [d["kind"] for d in doc["diagnoses"] if d["area"] == area]


# --- the h2d phase and H2D_BOUND --------------------------------------------------------------
def test_copies_are_a_phase_of_the_summary_and_h2d_bound_heads_it() -> None:
    # 3 ms of copies in a 13 ms step: 23 %, above h2d_bound_pct.
    doc = summary_doc({**OWN, "h2d": 3.0}, copies=True)
    st = doc["step_time"]
    assert st["h2d_pct"] == pytest.approx(100 * 3 / 13, abs=0.01)
    assert st["phase_ms"]["h2d"] == pytest.approx(3.0)
    assert list(k for k in st if k.endswith("_pct")) == [
        "dataloader_pct", "h2d_pct", "forward_pct", "backward_pct", "optimizer_pct", "other_pct"
    ]
    assert st["diagnosis"] == "H2D_BOUND"
    first = doc["diagnoses"][0]
    assert first["kind"] == "H2D_BOUND" and "23.1%" in first["message"]
    assert "pin_memory" in first["next_step"]
    assert summary_problems(doc) == []


def test_a_loader_that_does_not_pin_is_told_so_first() -> None:
    settings = DataLoaderSettings(num_workers=4, pin_memory=False, persistent_workers=True,
                                  prefetch_factor=2, batch_size=16, device="cuda")
    doc = summary_doc({**OWN, "h2d": 3.0}, copies=True, dataloader=settings)
    assert doc["diagnoses"][0]["next_step"].startswith("The DataLoader does not pin")


def test_a_few_percent_of_copies_is_no_diagnosis_and_input_comes_first() -> None:
    doc = summary_doc({**OWN, "h2d": 0.5}, copies=True)
    assert doc["step_time"]["diagnosis"] == "COMPUTE_BOUND"
    both = summary_doc({**OWN, "dataloader": 8.0, "h2d": 5.0}, copies=True)
    assert kinds(both, "step_time")[:2] == ["INPUT_BOUND", "H2D_BOUND"]


def test_a_run_that_made_no_copies_has_no_h2d_key() -> None:
    doc = summary_doc(OWN)
    assert "h2d_pct" not in doc["step_time"] and "h2d" not in doc["step_time"]["phase_ms"]
    assert "h2d" not in doc["step_time"]["noise"]["pct"]
    assert summary_problems(doc) == []


# --- the H2D straggler -------------------------------------------------------------------------
def rank_with(r: int, ms: dict[str, float]) -> dict[str, Any]:
    """A rank's summary whose step is exactly ``ms`` (any of ALL_PHASES; wait and h2d where
    given), with a steady window noise."""
    doc = make({p: ms.get(p, 0.0) for p in ("dataloader", "forward", "backward",
                                              "optimizer", "other")})
    doc["run"].update(rank=r, world_size=2)
    st = doc["step_time"]
    step = sum(ms.values())
    for p in ALL_PHASES:
        if p in ms:
            st[f"{p}_pct"] = round(100.0 * ms[p] / step, 2)
            st["phase_ms"][p] = ms[p]
            st["noise"]["pct"][p] = {"median": st[f"{p}_pct"], "iqr": 0.3}
    st["other_pct"] = round(100.0 - sum(st[f"{p}_pct"] for p in ALL_PHASES[:-1] if p in ms), 2)
    st["step_ms"] = {"median": step, "p10": step * 0.95, "p90": step * 1.05, "mean": step}
    return doc


def test_a_rank_slow_to_copy_its_batch_is_an_h2d_straggler() -> None:
    # Rank 1 copies 6 ms longer; rank 0 waits those 6 ms at the all-reduce.
    docs = [
        rank_with(0, {**OWN, "other": 0.5, "h2d": 1.0, "wait": 6.2}),
        rank_with(1, {**OWN, "other": 0.5, "h2d": 7.0, "wait": 0.2}),
    ]
    out = merge_ranks(docs, world_size=2)
    s = out["distributed"]["straggler"]
    assert (s["label"], s["rank"], s["cause"]) == (H2D_STRAGGLER, 1, "h2d")
    diag = next(d for d in out["diagnoses"] if d["kind"] == H2D_STRAGGLER)
    assert "Rank 1 copies" in diag["next_step"]
    assert out["distributed"]["ranks"][1]["phase_ms"]["h2d"] == 7.0
    assert summary_problems(out) == []


def test_copies_alike_on_every_rank_name_no_h2d_straggler() -> None:
    docs = [
        rank_with(0, {**OWN, "other": 0.5, "h2d": 3.0, "wait": 0.3}),
        rank_with(1, {**OWN, "other": 0.5, "h2d": 3.1, "wait": 0.2}),
    ]
    assert merge_ranks(docs, world_size=2)["distributed"]["straggler"]["label"] == (
        "RANKS_BALANCED"
    )


# --- the GPU sampler's figures -----------------------------------------------------------------
def gpu(util: float = 95.0, samples: int = 50, **temps: float) -> GpuUtil:
    return GpuUtil(util_mean_pct=util, util_p10_pct=util - 5, mem_used_peak_mb=4000.0,
                   samples=samples, **temps)


@pytest.mark.parametrize(
    ("figures", "expected"),
    [
        (gpu(), []),
        (gpu(util=25.0), [LOW_GPU_UTILIZATION]),
        (gpu(util=25.0, samples=TH.min_gpu_samples - 1), []),  # mostly start-up
        (gpu(temp_max_c=88.0, temp_mean_c=80.0), [HIGH_GPU_TEMPERATURE]),
        (gpu(temp_max_c=80.0, temp_mean_c=75.0), []),
        # within the margin of the device's own slowdown threshold
        (gpu(temp_max_c=80.0, temp_mean_c=75.0, temp_slowdown_c=83.0), [HIGH_GPU_TEMPERATURE]),
        (gpu(util=10.0, temp_max_c=90.0), [LOW_GPU_UTILIZATION, HIGH_GPU_TEMPERATURE]),
        (GpuUtil(), []),  # no NVML
    ],
)
def test_gpu_diagnoses(figures: GpuUtil, expected: list[str]) -> None:
    assert [d.kind for d in diagnose_gpu(figures, TH)] == expected


def test_gpu_diagnoses_reach_the_summary_with_the_temperatures() -> None:
    doc = build_summary(record(OWN, gpu=gpu(util=20.0, temp_max_c=91.0, temp_mean_c=84.0,
                                             temp_slowdown_c=92.0))).to_dict()
    assert kinds(doc, "gpu") == [LOW_GPU_UTILIZATION, HIGH_GPU_TEMPERATURE]
    assert doc["gpu"]["temp_max_c"] == 91.0 and doc["gpu"]["temp_slowdown_c"] == 92.0
    assert "20%" in doc["diagnoses"][-2]["message"]
    assert summary_problems(doc) == []
    plain = build_summary(record(OWN)).to_dict()
    assert kinds(plain, "gpu") == [] and "temp_max_c" not in plain["gpu"]


def test_the_sampler_reads_the_temperature_through_a_fake_pynvml() -> None:
    from traceml_ci.tracer.gpu_util import GpuUtilSampler

    temps = iter([70.0, 86.0, 78.0] + [75.0] * 1000)
    three = threading.Event()
    seen = []

    def temperature(handle: Any, sensor: int) -> float:
        assert sensor == 0  # NVML_TEMPERATURE_GPU
        seen.append(1)
        if len(seen) >= 3:
            three.set()
        return next(temps)

    nvml = SimpleNamespace(
        NVML_TEMPERATURE_GPU=0,
        NVML_TEMPERATURE_THRESHOLD_SLOWDOWN=1,
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=30.0),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=2**30),
        nvmlDeviceGetTemperature=temperature,
        nvmlDeviceGetTemperatureThreshold=lambda h, kind: 90.0 if kind == 1 else 0.0,
    )
    sampler = GpuUtilSampler(handle=object(), nvml=nvml, interval_s=0.001)
    sampler._thread.start()
    assert three.wait(5.0)
    figures = sampler.stop()
    assert figures.temp_max_c == 86.0 and figures.temp_slowdown_c == 90.0
    assert 70.0 <= figures.temp_mean_c <= 86.0

    # A device without a temperature sensor: utilisation still sampled, temperatures unknown.
    bare = SimpleNamespace(
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=30.0),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=2**30),
    )
    sampler = GpuUtilSampler(handle=object(), nvml=bare, interval_s=0.001)
    sampler._thread.start()
    while not sampler.util:
        three.wait(0.001)
    figures = sampler.stop()
    assert figures.samples >= 1 and figures.temp_max_c is None and figures.temp_slowdown_c is None


# --- ranks' GPU memory ---------------------------------------------------------------------
def with_peak(r: int, mb: float | None) -> dict[str, Any]:
    doc = rank_with(r, {**OWN, "other": 0.5})
    doc["step_memory"]["peak_allocated_mb"] = mb
    return doc


@pytest.mark.parametrize(
    ("peaks", "fires"),
    [
        ((30_000.0, 22_000.0, 21_900.0), True),  # rank 0 holds 8 GB more
        ((30_000.0, 29_000.0, 29_500.0), False),  # within a few percent
        ((2_000.0, 1_100.0, 1_050.0), False),  # 45 % but under 1 GB: a small model
        ((None, None, None), False),  # CPU ranks: no GPU peaks
    ],
)
def test_rank_gpu_memory_imbalance(peaks: tuple[float | None, ...], fires: bool) -> None:
    docs = [with_peak(r, mb) for r, mb in enumerate(peaks)]
    out = merge_ranks(docs, world_size=len(docs))
    found = [d for d in out["diagnoses"] if d["kind"] == RANK_GPU_MEMORY_IMBALANCE]
    assert bool(found) is fires
    if fires:
        assert "Rank 0 peaked at 30000 MB" in found[0]["message"]
        assert "rank 2" in found[0]["message"]
    assert summary_problems(out) == []
