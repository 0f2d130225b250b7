"""torch.compile's counts over a run (tracer/compiled.py): graph breaks and compiled frames,
the run's own (what the process compiled before it is left out). In a child process: a
compiled frame turns the step counters off for the rest of a process, and would for the tests
after this one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.cli.scripts import run_group
from traceml_ci.summary.schema import summary_problems

CHILD = """
import sys
import torch
from torch import nn
import traceml_ci as traceml
from traceml_ci.tracer import api
from traceml_ci.tracer.config import TracerConfig

torch.set_num_threads(1)


class Printing(nn.Module):
    def __init__(self, breaks):
        super().__init__()
        self.a, self.b, self.breaks = nn.Linear(8, 8), nn.Linear(8, 1), breaks

    def forward(self, x):
        h = self.a(x)
        if self.breaks:
            print("", end="")  # a graph break
        return self.b(h)


for name, breaks in (("clean", False), ("broken", True)):
    torch.manual_seed(0)
    model = Printing(breaks)
    step = torch.compile(model, backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tracer = api.start(TracerConfig(out_dir=sys.argv[1] + "/" + name, warmup_steps=5),
                       at_exit=False)
    for _ in range(10):
        with traceml.trace_step(model):
            step(torch.randn(4, 8)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    tracer.finish()
"""


def test_a_graph_break_is_counted_with_its_reason_the_runs_own(tmp_path: Path) -> None:
    done = run_group([sys.executable, "-c", CHILD, str(tmp_path)], cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    docs = {}
    for name in ("clean", "broken"):
        docs[name] = json.loads((tmp_path / name / "final_summary.json").read_text())
        assert summary_problems(docs[name]) == []
    clean, broken = docs["clean"]["counters"], docs["broken"]["counters"]
    # compiled: the step is not sampled, the compile block stands alone
    assert set(clean) == set(broken) == {"sampled_step", "compile"}
    assert clean["compile"]["graph_breaks"] == 0 and clean["compile"]["frames"] >= 1
    assert broken["compile"]["graph_breaks"] == 1  # once, when the frame was compiled
    [reason] = broken["compile"]["top_breaks"]
    assert "print" in reason["reason"] and reason["count"] == 1
    # the frame resumed after the break is compiled too; the first run's frames are not the
    # second's (the difference of the process's counters)
    assert broken["compile"]["frames"] > clean["compile"]["frames"]
