"""End to end: real traced runs of one script, with and without a scalar read each step, a leak,
another optimizer or a wider layer, through ``traceml-ci diff``: the deterministic counters
regress with the sentence that says what changed, and the same code twice passes them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """\
import sys
import torch
import traceml_ci as traceml
torch.set_num_threads(1)
torch.manual_seed(0)
wide = 64 if "wide" in sys.argv else 32
model = torch.nn.Sequential(torch.nn.Linear(16, wide), torch.nn.ReLU(), torch.nn.Linear(wide, 4))
opt = (torch.optim.AdamW if "adamw" in sys.argv else torch.optim.SGD)(model.parameters(), lr=0.01)
kept = []
traceml.init(out_dir="out", warmup_steps=5, run_name="counters")
x = torch.randn(8, 16)
for step in range(25):
    with traceml.trace_step(model):
        out = model(x)
        loss = out.square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if "item" in sys.argv:
            print(loss.item())
        if "leak" in sys.argv:
            kept.append(out.detach())
traceml.finish()
"""
ITEM_LINE = SCRIPT.splitlines().index("            print(loss.item())") + 1
MODEL_LINE = SCRIPT.splitlines().index("        out = model(x)") + 1


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name -> final_summary.json of a real traced run (each in its own folder, as train.py)."""
    root = tmp_path_factory.mktemp("counters")
    out: dict[str, Path] = {}
    for name, flags in (
        ("base", []),
        ("again", []),
        ("item", ["item"]),
        ("leak", ["leak"]),
        ("adamw", ["adamw"]),
        ("wide", ["wide"]),
    ):
        folder = root / name
        folder.mkdir()
        (folder / "train.py").write_text(SCRIPT)
        # subprocess.run kills the child when the timeout expires.
        done = subprocess.run(
            [sys.executable, "train.py", *flags],
            cwd=folder,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        out[name] = folder / "out" / "final_summary.json"
    return out


def _diff(base: Path, head: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "traceml_ci", "diff", str(base), str(head), *more],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=base.parent,
    )


def _rows(base: Path, head: Path) -> dict[str, dict]:
    done = _diff(base, head, "--format", "json")
    return {r["name"]: r for r in json.loads(done.stdout)["rows"]}


def test_the_same_code_twice_passes_every_counter(runs) -> None:
    rows = _rows(runs["base"], runs["again"])
    counters = {n: r for n, r in rows.items() if n.startswith("counters.")}
    assert set(counters) == {
        "counters.syncs_per_step",
        "counters.retained_bytes_per_step",
        "counters.optimizer",
        "counters.flops_per_step",
        "counters.parameters",
    }
    assert all(r["status"] == "ok" and r["note"] == "" for r in counters.values())
    assert counters["counters.syncs_per_step"]["delta"] == 0


def test_an_added_item_each_step_regresses_at_its_line(runs) -> None:
    done = _diff(runs["base"], runs["item"])
    assert done.returncode == 1, done.stdout + done.stderr
    said = f"adds 1 scalar read per step at train.py:{ITEM_LINE} (item)"
    # named in the headline, right under the verdict, before the reasons and the table
    assert done.stdout.splitlines()[1] == f"cause: {said}"
    md = _diff(runs["base"], runs["item"], "--format", "markdown")
    assert md.returncode == 1 and md.stdout.splitlines()[3] == f"**Cause:** {said}"
    report = runs["base"].parent / "report.md"
    quiet = _diff(runs["base"], runs["item"], "--format", "markdown", "-o", str(report))
    assert quiet.returncode == 1 and quiet.stdout == ""
    assert quiet.stderr == f"traceml-ci: regression: {said} (report in {report})\n"
    assert report.read_text() == md.stdout
    assert _rows(runs["item"], runs["base"])["counters.syncs_per_step"]["status"] == "improved"


def test_a_loop_that_keeps_its_outputs_regresses_with_the_bytes(runs) -> None:
    done = _diff(runs["base"], runs["leak"])
    assert done.returncode == 1, done.stdout + done.stderr
    text = " ".join(done.stdout.split())
    assert f"retains 128 B more per step (addmm at train.py:{MODEL_LINE})" in text  # 8×4 fp32


def test_an_optimizer_change_regresses_and_says_so(runs) -> None:
    done = _diff(runs["base"], runs["adamw"])
    assert done.returncode == 1, done.stdout + done.stderr
    assert "optimizer SGD → AdamW (+2 state tensors per parameter)" in " ".join(done.stdout.split())


def test_a_flop_change_names_the_module(runs) -> None:
    row = _rows(runs["base"], runs["wide"])["counters.flops_per_step"]
    assert row["status"] == "regressed"
    # Both layers double (16→32→4 becomes 16→64→4): +100 %. The first layer moved most: its
    # forward 2·8·16·32 and its weight's gradient as much again (its input needs none); the
    # second's forward 2·8·32·4 and both gradients, three times that.
    assert row["note"] == "FLOPs per step +100 % (0 Linear +16.4 kFLOP, 2 Linear +6.14 kFLOP)"
    assert _rows(runs["base"], runs["wide"])["counters.parameters"]["note"] == (
        "parameters 676 → 1,348"
    )
