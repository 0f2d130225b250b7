"""Tracer test helpers: a fresh tracer per test, and the summary it writes (validated)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from traceml_ci.summary.schema import summary_problems
from traceml_ci.tracer import api
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
        if tracer.roots is not None:
            tracer.roots.uninstall()


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
