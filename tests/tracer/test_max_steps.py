"""TracerConfig.max_steps: the tracer records the first N steps (warmup included), then stops."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceml_ci.tracer import api
from traceml_ci.tracer.clocks import HostClock
from traceml_ci.tracer.config import TracerConfig
from traceml_ci.tracer.steps import StepStore


def test_store_drops_steps_after_max_steps() -> None:
    store = StepStore(HostClock(), warmup_steps=2, rss=None, max_steps=5)
    for i in range(9):
        store(0, (i + 1) * 1_000_000, [], [])  # host marks are nanoseconds
    assert store.steps_total == 5
    assert store.column(0) == [3.0, 4.0, 5.0]  # steps 3..5: after warmup, before the cap


def test_store_without_cap_keeps_everything() -> None:
    store = StepStore(HostClock(), warmup_steps=0, rss=None)
    for i in range(7):
        store(0, i + 1, [], [])
    assert store.steps_total == 7


def test_config_rejects_a_cap_below_one() -> None:
    with pytest.raises(ValueError, match="max_steps"):
        TracerConfig(max_steps=0)


def test_tracer_summary_counts_only_capped_steps(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import traceml_ci as traceml

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tracer = api.start(TracerConfig(out_dir=tmp_path, warmup_steps=2, max_steps=12), at_exit=False)
    try:
        for _ in range(30):
            with traceml.trace_step(model):
                opt.zero_grad()
                model(torch.ones(2, 4)).sum().backward()
                opt.step()
        tracer.finish()
    finally:
        api.stop()
    st = tracer.summary.to_dict()["step_time"]
    assert (st["steps_total"], st["steps_analyzed"], st["warmup_steps"]) == (12, 10, 2)
