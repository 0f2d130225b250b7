"""The issue's "done when": a change that slows one submodule fails its smoke test with a
message -- and a PR report -- that names that submodule and its share. Real pytest sessions,
the plugin's default module sampling for smoke tests."""

from __future__ import annotations

import re

from tests.pytest_plugin.conftest import SmokeProject

#: A model whose ``layer.<SLOW_LAYER>`` spins SLOW_LAYER_MS in its forward, fed by a loader
#: that spins 4 ms a batch (so forward is about a third of the step to begin with).
LAYERS_MODULE = '''
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import traceml_ci as traceml

torch.set_num_threads(1)


def _spin(ms):
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass


class Batches(Dataset):
    def __init__(self, steps):
        self.x = torch.randn(steps, 16, 32)
        self.y = torch.randn(steps, 16, 1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        _spin(4.0)
        return self.x[i], self.y[i]


class Block(nn.Module):
    def __init__(self, index):
        super().__init__()
        self.index = index
        self.lin = nn.Linear(64, 64)

    def forward(self, x):
        if str(self.index) == os.environ.get("SLOW_LAYER", "3"):
            _spin(float(os.environ.get("SLOW_LAYER_MS", "1")))
        return torch.relu(self.lin(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(32, 64)
        self.layer = nn.ModuleList(Block(i) for i in range(4))
        self.head = nn.Linear(64, 1)

    def forward(self, x):
        x = self.embed(x)
        for block in self.layer:
            x = block(x)
        return self.head(x)


def train(steps=70):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in DataLoader(Batches(steps), batch_size=None):
        with traceml.trace_step(model):
            opt.zero_grad(set_to_none=True)
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
'''

LAYERS_TEST = '''
import pytest

from layers_train import train


@pytest.mark.traceml(warmup_steps=5)
def test_layers():
    train()
'''


def test_a_slower_submodule_is_named_with_its_share_in_the_failure_and_the_report(
    smoke: SmokeProject,
) -> None:
    smoke.pytester.makepyfile(layers_train=LAYERS_MODULE)
    smoke.tests(LAYERS_TEST)
    smoke.monkeypatch.setenv("SLOW_LAYER", "3")
    smoke.monkeypatch.setenv("SLOW_LAYER_MS", "1")
    smoke.run("--traceml-update-baseline", "--traceml-baseline-runs=1").assert_outcomes(passed=1)
    entry = smoke.baseline_summaries()["test_smoke.py::test_layers"]
    mods = entry["modules"]  # sampled every 20 ms by default in traced tests
    assert mods["every_s"] == 0.02 and mods["sampled_steps"] >= 4, mods
    assert "layer.3" in {m["name"] for m in mods["forward"]}  # the slowest listed (of ~10)

    smoke.monkeypatch.setenv("SLOW_LAYER_MS", "12")  # the change under review
    report = smoke.path / "report.md"
    slowed = smoke.run("--traceml-confirm=0", f"--traceml-report={report}")
    slowed.assert_outcomes(failed=1)
    out = slowed.stdout.str()
    # The forward row's note names layer.3 (what it moved may wrap to the row's next line:
    # the table is as wide as the terminal, its metric column as its longest row name).
    slowed.stdout.re_match_lines([r".*step_time\.forward_pct.*regressed — layer\.3 \(Block\).*"])
    # ... and the failure's reason line says it whole, whatever the table's width wraps.
    reason = next((ln for ln in out.splitlines() if ln.startswith("• step_time.forward_pct:")), "")
    assert re.search(r" — layer\.3 \(Block\) \+\d+\.\d pp \(\d+ % of forward\)", reason), out
    md = report.read_text()
    assert "layer.3 (Block) +" in md and "% of forward)" in md, md

    # Sampling off: the same regression, and no module named.
    off = smoke.run("--traceml-confirm=0", "--traceml-module-sample-s=0")
    off.assert_outcomes(failed=1)
    assert "layer.3 (Block)" not in off.stdout.str()


def test_a_bad_module_sample_period_is_one_line(smoke: SmokeProject) -> None:
    smoke.tests(LAYERS_TEST)
    result = smoke.run("--traceml-module-sample-s=soon", gate=False)
    assert result.ret == 4
    result.stderr.fnmatch_lines(
        ["*--traceml-module-sample-s must be a number of seconds >= 0, not 'soon'*"])
