"""The CUDA code paths, driven with fakes: lazy event resolution, memory peaks, NVML sampling.

The fake events are stamped with a fake clock's time (``FakeEventLog.now``) where a test
checks what a phase holds: the device clock's figures are then exact."""

from __future__ import annotations

import pytest

from tests.tracer.conftest import finish_and_load
from tests.tracer.fakes import (
    FakeClock,
    FakeEventLog,
    fake_torch_for_memory,
)
from tests.tracer.loops import (
    BusyModel,
    BusySGD,
    busy_job,
    busy_loader,
    fake_device_run,
    recorder_step,
    spend_on,
)
from traceml_ci.tracer.clocks import DeviceEventClock
from traceml_ci.tracer.memory import MB, CudaMemory
from traceml_ci.tracer.recorder import BWD, DL, FWD, OPT, Recorder
from traceml_ci.tracer.steps import MAX_PENDING_STEPS, StepStore


def test_events_resolve_lazily_with_query_and_never_synchronize_per_step() -> None:
    log = FakeEventLog(lag_records=30)  # ~3 steps behind
    clock = DeviceEventClock(log.factory)
    store = StepStore(clock, warmup_steps=0, rss=None)
    rec = Recorder(clock.mark, store)
    for _ in range(20):
        recorder_step(rec)
    assert log.syncs == 0  # the host never waited for the device
    assert store.steps_total == 20
    assert 0 < len(store.pending) < 20  # recent steps still in flight
    assert store.resolved == 20 - len(store.pending)
    store.drain_all()
    assert store.resolved == 20 and not store.pending
    assert log.syncs <= 1  # one wait at finish resolves everything before it
    # Events are recycled: far fewer created than the 10 recorded per step.
    assert log.created < 10 * 20 / 2
    assert store.columns.n == 20


def test_a_device_far_behind_is_waited_for_rather_than_queued_forever() -> None:
    log = FakeEventLog(lag_records=10**9)  # never completes on its own
    clock = DeviceEventClock(log.factory)
    store = StepStore(clock, warmup_steps=0, rss=None)
    rec = Recorder(clock.mark, store)
    for _ in range(MAX_PENDING_STEPS * 3):
        recorder_step(rec)
    assert len(store.pending) <= MAX_PENDING_STEPS + 1
    assert log.syncs >= 1


def test_shared_boundary_events_are_never_released_twice() -> None:
    log = FakeEventLog(lag_records=0)
    clock = DeviceEventClock(log.factory)
    store = StepStore(clock, warmup_steps=0, rss=None)
    rec = Recorder(clock.mark, store, implicit=True)  # zero-change: steps share boundaries
    for _ in range(6):
        for p in (DL, FWD, BWD, OPT):
            rec.phase_begin(p)
            rec.phase_end(p)
    rec.flush()
    store.drain_all()
    pool = clock._pool
    assert len(pool) == len({id(e) for e in pool})


def test_cuda_memory_reads_peaks_from_the_allocator_and_resets_them() -> None:
    stats = {
        "allocated_bytes": {"all": {"peak": 512 * 2**20}},
        "reserved_bytes": {"all": {"peak": 768 * 2**20}},
        "num_alloc_retries": 3,
        "num_ooms": 1,
    }
    fake_torch, calls = fake_torch_for_memory(stats)
    mem = CudaMemory(fake_torch, 0)
    assert calls.reset == 1  # peaks start clean
    assert mem.read_and_reset() == (512.0, 768.0)
    assert calls.reset == 2
    assert mem.counters() == (3, 1)
    assert mem.total_mb() == 16 * 1024.0
    assert MB == 2**20


def test_device_run_end_to_end_fills_memory_fields_and_clock(fresh_tracer, fake_cuda) -> None:
    log, memory = fake_cuda
    tracer = fake_device_run(fresh_tracer, log, 20, 1.0, 1.0, 1.0, 0.5)
    assert log.syncs == 0
    doc = finish_and_load(tracer)
    st, mem = doc["step_time"], doc["step_memory"]
    assert st["clock"] == "device_event"
    assert st["steps_total"] == 20 and st["steps_analyzed"] == 18
    assert st["phase_ms"] == {"dataloader": 1.0, "forward": 1.0, "backward": 1.0,
                              "optimizer": 0.5, "other": 0.0}
    assert st["step_ms"]["median"] == 3.5
    assert mem["device"] == "cuda:0"
    assert mem["peak_allocated_mb"] == 1000.0 and mem["peak_reserved_mb"] == 3000.0
    assert mem["alloc_retries"] == 2 and mem["ooms"] == 0
    assert mem["growth_basis"] == "allocated"
    # 2 GB cached but unallocated, 3x the allocation: fragmentation.
    assert mem["diagnosis"] == "FRAGMENTATION"
    assert memory.reads == 20


def test_device_memory_growth_is_diagnosed(fresh_tracer, fake_cuda) -> None:
    _, memory = fake_cuda
    memory.reserved_mb = memory.allocated_mb = 500.0
    memory.growth_mb = 10.0  # +10 MB every step
    clock = FakeClock()
    tracer = fresh_tracer(warmup_steps=0, clock=clock)
    busy_job(40, 0.1, spend_on(clock))
    mem = finish_and_load(tracer)["step_memory"]
    assert mem["diagnosis"] == "MEMORY_GROWTH"
    assert mem["growth_mb_per_1k_steps"] == pytest.approx(10_000.0, rel=0.01)


def test_gpu_util_sampler_with_a_fake_nvml() -> None:
    import threading
    from types import SimpleNamespace

    from traceml_ci.tracer.gpu_util import GpuUtilSampler

    readings = iter([50.0, 70.0, 90.0, 100.0] * 100)
    got_three = threading.Event()
    count = {"n": 0}

    def util(handle):
        count["n"] += 1
        if count["n"] >= 3:
            got_three.set()
        return SimpleNamespace(gpu=next(readings))

    nvml = SimpleNamespace(
        nvmlDeviceGetUtilizationRates=util,
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=2 * 2**30),
    )
    sampler = GpuUtilSampler(handle=object(), nvml=nvml, interval_s=0.001)
    sampler._thread.start()
    assert got_three.wait(5.0)
    summary = sampler.stop()
    assert summary.samples >= 3
    assert 50.0 <= summary.util_mean_pct <= 100.0
    assert summary.mem_used_peak_mb == 2048.0


def test_no_nvidia_gpu_means_no_sampler_and_no_noise(capfd) -> None:
    from traceml_ci.tracer.gpu_util import GpuUtilSampler

    assert GpuUtilSampler.start_for(0) is None  # no driver here (or no pynvml): silently None
    assert capfd.readouterr().err == ""


def test_cpu_run_has_null_device_memory_fields(fresh_tracer) -> None:
    clock = FakeClock()
    tracer = fresh_tracer(warmup_steps=0, clock=clock)
    busy_job(12, 0.1, spend_on(clock))
    doc = finish_and_load(tracer)
    mem = doc["step_memory"]
    assert mem["peak_allocated_mb"] is None and mem["peak_reserved_mb"] is None
    assert mem["peak_rss_mb"] > 10
    assert doc["gpu"]["util_mean_pct"] is None and doc["gpu"]["samples"] == 0
    assert doc["step_time"]["clock"] == "host"


def test_steps_past_max_steps_give_their_events_back() -> None:
    log = FakeEventLog(lag_records=0)
    clock = DeviceEventClock(log.factory)
    store = StepStore(clock, warmup_steps=0, rss=None, max_steps=3)
    rec = Recorder(clock.mark, store)
    for _ in range(50):
        recorder_step(rec)
    store.drain_all()
    assert store.steps_total == 3
    assert log.created < 40  # recycled, not one new set of events per dropped step


def test_device_marks_count_a_closure_to_forward_and_backward(fresh_tracer, fake_cuda) -> None:
    """The general path (device events) splits optimizer.step(closure) like the host one."""
    from tests.tracer.loops import closure_steps
    from traceml_ci.tracer.steps import PHASE_COLS

    log, _ = fake_cuda
    clock = FakeClock()
    log.now = clock.mark
    spend = spend_on(clock)
    tracer = fresh_tracer(warmup_steps=2, clock=clock)
    model = BusyModel(2.0, 3.0, spend=spend)
    optimizer = BusySGD(model.parameters(), step_ms=1.0, spend=spend)
    assert closure_steps(optimizer, model, iter(busy_loader(14, 1.0, spend=spend)), 14) == [1] * 14
    tracer.store.drain_all()
    assert log.syncs <= 1  # only the drain at the end waited
    assert tracer.store.clock.kind == "device_event"
    got = {p: tracer.store.column(PHASE_COLS[p])
           for p in ("dataloader", "forward", "backward", "optimizer")}
    assert got == {"dataloader": [1.0] * 12, "forward": [2.0] * 12, "backward": [3.0] * 12,
                   "optimizer": [1.0] * 12}
