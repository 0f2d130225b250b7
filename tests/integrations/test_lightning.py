"""The Lightning callback and zero-change ``traceml-ci run``, against a real lightning.Trainer
with automatic optimization (forward and backward run inside ``optimizer.step(closure)``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integrations.conftest import load_summary, one_thread_no_tracer
from tests.integrations.spin import (
    Stopwatch,
    assert_one_step_per_optimizer_step,
    assert_shares_match,
)

pytestmark = pytest.mark.integration

pytest.importorskip("lightning")

from tests.integrations import lightning_job as job  # noqa: E402  (needs lightning)
from traceml_ci.integrations.lightning import TraceMLCallback  # noqa: E402

#: The stopwatch times the dataset's items and the collate; Lightning fetches through the
#: DataLoader's iterator, whose own fetch loop it cannot cover (measured quietly +1.4 pp; in
#: the Accelerate recipe, where it can, 0.41 ms a batch): the dataloader's tolerance is wider.
LOADER_PP = 3.0


@pytest.fixture(scope="module")
def callback_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Stopwatch]:
    """One fit() with the callback: its summary and the stopwatch of the same run."""
    import torch

    out = tmp_path_factory.mktemp("lightning") / "out"
    watch = Stopwatch()
    with one_thread_no_tracer():
        torch.manual_seed(0)
        callback = TraceMLCallback(out_dir=out, warmup_steps=job.WARMUP, run_name="pl-mlp")
        job.trainer([callback]).fit(job.SpinMLP(watch), job.loader(watch))
        doc = load_summary(out)  # written at train end
    return doc, watch


def test_callback_traces_each_optimizer_step(callback_run: tuple[dict, Stopwatch]) -> None:
    doc, watch = callback_run
    assert_one_step_per_optimizer_step(doc, watch, job.STEPS, job.WARMUP, "pl-mlp")
    assert doc["step_time"]["throughput"]["batch_size"] == job.BATCH


def test_callback_shares_within_2pp_of_a_stopwatch(callback_run: tuple[dict, Stopwatch]) -> None:
    """Forward and backward run inside optimizer.step(closure): they must still count as
    forward and backward, the optimizer only its own time (issue 9 item 1, a tracer fix)."""
    doc, watch = callback_run
    assert_shares_match(doc, watch, dataloader_pp=LOADER_PP)


def run_job(tmp_path: Path, *args: str) -> tuple[dict, Stopwatch]:
    """``traceml-ci run lightning_job.py``: its summary and stopwatch."""
    watch_path, out = tmp_path / "watch.json", tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "traceml_ci", "run", "--out", str(out)]
    cmd += ["--warmup-steps", str(job.WARMUP), job.__file__, str(watch_path), *args]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return load_summary(out), Stopwatch.load(watch_path)


def test_zero_change_run_shares_within_2pp_of_a_stopwatch(tmp_path: Path) -> None:
    """``traceml-ci run`` on a Lightning script that never imports traceml-ci."""
    doc, watch = run_job(tmp_path)
    assert doc["run"]["mode"] == "zero-change"
    assert doc["step_time"]["steps_total"] == job.STEPS
    assert_shares_match(doc, watch, dataloader_pp=LOADER_PP)


def test_callback_under_traceml_ci_run_joins_its_tracer(tmp_path: Path) -> None:
    """The callback uses the launcher's tracer: ``--out`` wins over the callback's out_dir, the
    steps are the callback's (mode auto), and one summary is written."""
    doc, watch = run_job(tmp_path, "--callback")
    assert not (tmp_path / "ignored: traceml-ci run --out wins").exists()
    assert doc["run"]["mode"] == "auto"
    assert doc["step_time"]["steps_total"] == job.STEPS == len(watch.step_ends)


def test_accumulated_batches_make_one_step(tmp_path: Path) -> None:
    """accumulate_grad_batches=2: a step per optimizer step, covering both batches."""
    watch = Stopwatch()
    callback = TraceMLCallback(out_dir=tmp_path, warmup_steps=0)
    model = job.SpinMLP(watch, optimizer_ms=0.0)
    job.trainer([callback], max_steps=4, accumulate_grad_batches=2).fit(
        model, job.loader(watch, batches=8, item_ms=0.0)
    )
    st = load_summary(tmp_path)["step_time"]
    assert len(watch.step_ends) == 4 and len(watch.events["forward"]) == 8
    assert st["steps_total"] == 4
    # Each step spans both batches: two forwards and two backwards.
    assert st["step_ms"]["median"] >= 2 * (job.FORWARD_MS + job.BACKWARD_MS)


def test_a_crash_in_training_step_writes_a_crashed_summary(tmp_path: Path) -> None:
    watch = Stopwatch()
    callback = TraceMLCallback(out_dir=tmp_path, warmup_steps=0)
    model = job.SpinMLP(watch, optimizer_ms=0.0)
    model.fail_at = 3
    with pytest.raises(RuntimeError, match="boom"):
        job.trainer([callback]).fit(model, job.loader(watch, batches=8, item_ms=0.0))
    doc = load_summary(tmp_path)
    assert doc["run"]["status"] == "crashed"
    assert doc["step_time"]["steps_total"] == 3  # the step that raised is dropped
