"""End to end: traced runs, then `traceml-ci diff` and `traceml-ci show` on their summaries.
The slow submodule is named where the time went, in the words a PR comment uses.

The runs spend fake time (``fakes.FakeClock``): each module's share is what its layers spent,
exactly, so what the diff says of them is the same on any machine."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.cli.scripts import run_group
from tests.tracer.conftest import finish_and_load
from tests.tracer.fakes import FakeClock
from tests.tracer.loops import spend_on
from tests.tracer.test_module_backward import Net, _train
from traceml_ci.summary.io import write_summary


def _run(fresh_tracer, tmp_path: Path, name: str, costs: list[float]) -> Path:
    clock = FakeClock()
    tracer = fresh_tracer(warmup_steps=3, module_sample_s=0.03, out_dir=tmp_path / name,
                          clock=clock)
    _train(Net(costs, spend_on(clock), forward_ms=3.0), 60, clock)
    doc = finish_and_load(tracer)
    path = tmp_path / f"{name}.json"
    write_summary(path, doc)
    return path


def _cli(tmp_path: Path, *args: str):
    return run_group([sys.executable, "-m", "traceml_ci", *args], cwd=tmp_path, timeout=60)


def test_the_diff_names_where_the_slowness_moved_and_what_slowed(
    fresh_tracer, fake_waits, tmp_path
) -> None:
    # Each layer's backward (fake ms); the model's forward 3 ms: backward is about half the step.
    base = _run(fresh_tracer, tmp_path, "base", [0.1, 0.1, 0.1, 3.0])
    moved = _run(fresh_tracer, tmp_path, "moved", [0.1, 3.0, 0.1, 0.1])
    # layer.3's backward 10x slower: backward's share rises by some 38 pp, well beyond the host
    # clock's +25 pp band and CONTENTION_MAX_SHIFT_PP (gate/timing/guards.py), the most the
    # contention
    # guard excuses when other work shares the CPU.
    slower = _run(fresh_tracer, tmp_path, "slower", [0.1, 0.1, 0.1, 30.0])

    # The slowness moved from layer.3 to layer.1: backward held still, both are named.
    # Wide enough that the row naming both modules does not wrap inside its table cell.
    out = _cli(tmp_path, "diff", "--width", "400", str(base), str(moved))
    assert out.returncode != 1, out.stdout + out.stderr  # no regression from a move alone
    text = out.stdout
    flat = " ".join(text.split())  # a context line may still wrap
    # Backward's share is the same to the µs (fake time): the move is a context line, naming
    # both modules, the one that grew and the one that shrank (issue #23: only layer.1 was).
    assert "time moved within backward" in text, text
    line = flat.split("time moved within backward", 1)[1].split("•", 1)[0]
    assert "layer.1 (Layer) +" in line and "layer.3 (Layer) -" in line, line

    # layer.3 got slower: backward's share regressed, and its row in the PR comment's
    # markdown names layer.3, what it moved and its share of backward now.
    out = _cli(tmp_path, "diff", "--format", "markdown", str(base), str(slower))
    assert out.returncode == 1, out.stdout + out.stderr
    row = next(ln for ln in out.stdout.splitlines() if ln.startswith("| step_time.backward_pct"))
    assert re.search(r"regressed — layer\.3 \(Layer\) \+\d+\.\d pp \(\d+ % of backward\)", row), row

    shown = _cli(tmp_path, "show", str(slower))
    assert shown.returncode == 0, shown.stderr
    assert "backward by module" in shown.stdout and "forward by module" in shown.stdout
    assert "layer.3" in shown.stdout.split("backward by module", 1)[1].splitlines()[0]
