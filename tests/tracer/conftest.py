"""Tracer test helpers: a fresh tracer per test, and the summary it writes (validated)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.tracer.fakes import FakeCudaMemory, FakeDevice, FakeEventLog, FakeWait
from traceml_ci.summary.schema import summary_problems
from traceml_ci.tracer import api, session
from traceml_ci.tracer.clocks import HostClock
from traceml_ci.tracer.config import TracerConfig


@pytest.fixture
def fresh_tracer(tmp_path: Path, torch_single_thread: None) -> Iterator[Callable[..., Any]]:
    """``fresh_tracer(mode=..., warmup_steps=..., zero_change=..., clock=...)`` -> a started
    Tracer (``clock``: a factory of its host clock, e.g. a ``fakes.FakeClock``)."""
    started: list[Any] = []

    def make(**options: Any) -> Any:
        zero_change = options.pop("zero_change", False)
        clock = options.pop("clock", HostClock)
        options.setdefault("out_dir", tmp_path / "out")
        options.setdefault("warmup_steps", 2)
        tracer = api.start(TracerConfig(**options), zero_change=zero_change, at_exit=False,
                           clock=clock)
        started.append(tracer)
        return tracer

    yield make
    api.stop()
    for tracer in started:
        tracer.patches.uninstall()
        tracer.copies.uninstall()  # torch.Tensor's methods, even where a test failed midway
        if tracer.roots is not None:
            tracer.roots.uninstall()


@pytest.fixture
def fake_waits(monkeypatch: pytest.MonkeyPatch) -> FakeWait:
    """The module sampler reads the thread's waits for a CPU from a ``FakeWait`` (0 until a
    test advances it): with a ``FakeClock``, a module's time is then exactly what its loop
    spent, whatever the machine's real preemptions (which the hooks would subtract)."""
    from traceml_ci.tracer import modules

    wait = FakeWait()
    monkeypatch.setattr(modules, "ThreadWait", lambda: wait)
    return wait


@pytest.fixture(scope="session")
def pinned_run_with_a_hog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One traced child for the tests of two files (a child that imports torch takes seconds
    on a loaded runner): its steps spin 1 ms of CPU and sleep 2 ms, pinned to one CPU, a busy
    loop pinned beside it for the middle third of the run (test_cputime.HOG_MIDWAY_CHILD).
    Its folder: ``final_summary.json`` and the child's own ``stopwatch.json``."""
    import os
    import subprocess
    import sys

    from tests.tracer.test_cputime import HOG_MIDWAY_CHILD, HOG_SAYS_SO

    out = tmp_path_factory.mktemp("pinned")
    cpu = min(os.sched_getaffinity(0))
    done = subprocess.run(
        [sys.executable, "-c", HOG_MIDWAY_CHILD, str(cpu), str(out), HOG_SAYS_SO],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return out


def finish_and_load(tracer: Any) -> dict[str, Any]:
    """Finish ``tracer``; assert its summary file is schema-valid; return the document."""
    import json

    path = tracer.finish()
    assert path is not None and path.is_file()
    doc = json.loads(path.read_text())
    assert summary_problems(doc) == []
    return doc


def pct(doc: dict[str, Any], phase: str) -> float:
    return doc["step_time"][f"{phase}_pct"]


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """Make the tracer believe the model lives on cuda:0, with fake events and allocator."""
    log = FakeEventLog(lag_records=25)
    memory = FakeCudaMemory(allocated_mb=1000.0, reserved_mb=3000.0)
    monkeypatch.setattr(session, "device_event_factory", lambda device: log.factory)
    monkeypatch.setattr(session, "CudaMemory", lambda torch_mod, index: memory)
    monkeypatch.setattr(session, "_model_device", lambda models: FakeDevice("cuda", 0))
    monkeypatch.setattr(session.Tracer, "_start_gpu_sampler", lambda self, t, i: None)
    return log, memory


def marked_line(path: str, marker: str) -> int:
    """The line of file ``path`` that ends with ``# marker`` (so no test hard-codes a line
    number)."""
    with open(path) as f:
        lines = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# {marker}")]
    assert len(lines) == 1, marker
    return lines[0]
