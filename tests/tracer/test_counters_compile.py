"""torch.compile's counts over a run (tracer/compiled.py): graph breaks and compiled frames,
the run's own (what the process compiled before it is left out)."""

from __future__ import annotations

import torch
from torch import nn

import traceml_ci as traceml
from tests.tracer.conftest import finish_and_load


class _Printing(nn.Module):
    """A forward with a graph break: a print between two layers."""

    def __init__(self, breaks: bool) -> None:
        super().__init__()
        self.a, self.b, self.breaks = nn.Linear(8, 8), nn.Linear(8, 1), breaks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if self.breaks:
            print("", end="")  # a graph break
        return self.b(h)


def _run(fresh_tracer, out_dir, breaks: bool) -> dict:
    torch.manual_seed(0)
    model = _Printing(breaks)
    step = torch.compile(model, backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tracer = fresh_tracer(warmup_steps=5, out_dir=out_dir)
    for _ in range(10):
        with traceml.trace_step(model):
            step(torch.randn(4, 8)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    return finish_and_load(tracer)["counters"]


def test_a_graph_break_is_counted_with_its_reason_the_runs_own(fresh_tracer, tmp_path) -> None:
    torch._dynamo.reset()
    clean = _run(fresh_tracer, tmp_path / "clean", breaks=False)
    broken = _run(fresh_tracer, tmp_path / "broken", breaks=True)
    # compiled: the step is not sampled, the compile block stands alone
    assert set(clean) == set(broken) == {"sampled_step", "compile"}
    assert clean["compile"]["graph_breaks"] == 0 and clean["compile"]["frames"] >= 1
    assert broken["compile"]["graph_breaks"] == 1  # once, when the frame was compiled
    [reason] = broken["compile"]["top_breaks"]
    assert "print" in reason["reason"] and reason["count"] == 1
    # the frame resumed after the break is compiled too; the first run's frames are not the
    # second's (the difference of the process's counters)
    assert broken["compile"]["frames"] > clean["compile"]["frames"]
