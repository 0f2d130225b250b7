"""Only the process that owns the run traces and writes: DataLoader workers (spawn, forkserver,
fork; one run holds all three) re-running a top-level ``init()`` never touch the summary, and a
second process cannot clobber a finished one. Real processes, with a stopwatch in the same run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.scripts import kill_group, run_group, write_script
from tests.conftest import stopwatch_tolerance_pp
from traceml_ci.summary.schema import summary_problems
from traceml_ci.summary.stats import tukey_keep_mask

PHASES = ("dataloader", "forward", "backward", "optimizer")
WARMUP = 6  # the script's init(warmup_steps=6)


def _stopwatch_shares(path: Path) -> dict[str, float]:
    """Each phase's share of step wall time by the script's own stopwatch, over the steps the
    tracer analyses (warmup and far outliers left out, as it does)."""
    truth = json.loads(path.read_text())
    walls, steps = truth["walls"][WARMUP:], truth["phases"][WARMUP:]
    keep = tukey_keep_mask(walls, 3.0)
    wall = sum(w for w, k in zip(walls, keep, strict=True) if k)
    return {
        p: 100.0 * sum(s[p] for s, k in zip(steps, keep, strict=True) if k) / wall for p in PHASES
    }


#: launcher -> the DataLoaders of its run (``workers.py``'s arguments): under plain Python one
#: run holds a loader of each start method, one after another (a process saved per method);
#: the fork first, forked before the other loaders' queue threads exist.
LOADERS = {
    "python": ("fork", "forkserver", "spawn:persistent"),
    "traceml-ci run": ("spawn:persistent",),
}


@pytest.mark.parametrize("launcher", LOADERS)
def test_workers_rerunning_init_leave_the_summary_alone(tmp_path, launcher) -> None:
    loaders = LOADERS[launcher]
    assert 2 * len(loaders) <= WARMUP  # each loader's first two batches (start-up) in warmup
    script = write_script(tmp_path, "workers.py")
    truth = tmp_path / "stopwatch.json"
    front = [sys.executable, *([] if launcher == "python" else ["-m", "traceml_ci", "run"])]
    proc = run_group([*front, str(script), str(truth), *loaders], tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = tmp_path / "traceml-out" / "final_summary.json"
    doc = json.loads(summary.read_text())
    assert summary_problems(doc) == []
    assert sorted(p.name for p in summary.parent.iterdir()) == ["final_summary.json", "live"]
    # One live snapshot, the owner's: workers re-running init() write none.
    assert [p.name for p in (summary.parent / "live").iterdir()] == ["rank0.json"]
    st = doc["step_time"]
    assert st["steps_total"] == 40  # the main process's steps, not a worker's empty run
    assert st["warmup_steps"] == WARMUP  # the steps the stopwatch's shares leave out
    assert doc["run"]["mode"] == "auto"
    assert doc["run"]["status"] == "completed"
    # One line, from the owner: workers print nothing.
    assert proc.stderr.count("traceml-ci: summary written to") == 1, proc.stderr
    shares = _stopwatch_shares(truth)
    tolerance = stopwatch_tolerance_pp(doc, 2.0)
    for phase in PHASES:
        assert st[f"{phase}_pct"] == pytest.approx(shares[phase], abs=tolerance), (phase, shares)


def test_a_second_process_cannot_clobber_a_finished_summary(tmp_path) -> None:
    """B starts tracing into OUT; A runs and finishes into OUT meanwhile; B's finish goes to a
    folder of its own, says where, and A's summary stays as A wrote it."""
    out = tmp_path / "out"
    go = tmp_path / "go"
    late = subprocess.Popen(
        [sys.executable, str(write_script(tmp_path, "late.py")), str(go), str(out)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    try:
        assert late.stdout.readline().startswith("ready")
        first = run_group(
            [sys.executable, "-m", "traceml_ci", "run", "--out", str(out), "--run-name", "A",
             str(write_script(tmp_path, "plain_exit3.py")), "x"],
            tmp_path,
        )
        assert first.returncode == 3, first.stderr
        written = (out / "final_summary.json").read_bytes()
        go.touch()
        _, err = late.communicate(timeout=60)
        assert late.returncode == 0, err
    finally:
        kill_group(late)
    assert (out / "final_summary.json").read_bytes() == written  # A's, untouched
    own = out / f"pid-{late.pid}" / "final_summary.json"
    # (late.py records no steps: the tracer's manual-mode warning may come first)
    assert err.strip().splitlines()[-1] == (
        f"traceml-ci: another process wrote {out / 'final_summary.json'} during this run; "
        f"this one's summary went to {own}"
    )
    doc = json.loads(own.read_text())
    assert summary_problems(doc) == []
    assert doc["run"]["name"] == "late"
    assert json.loads(written)["run"]["name"] == "A"


def test_a_later_run_in_the_same_folder_replaces_the_summary(tmp_path) -> None:
    """The guard is about runs that overlap: running again after a finished run replaces it."""
    out = tmp_path / "out"
    script = write_script(tmp_path, "plain_exit3.py")
    for name in ("first", "second"):
        proc = run_group(
            [sys.executable, "-m", "traceml_ci", "run", "--out", str(out), "--run-name", name,
             str(script)],
            tmp_path,
        )
        assert proc.returncode == 3, proc.stderr
    assert json.loads((out / "final_summary.json").read_text())["run"]["name"] == "second"
    assert [p.name for p in out.iterdir()] == ["final_summary.json"]
