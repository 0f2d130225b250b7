"""Distributed runs for real: examples/train_ddp.py under plain torchrun (the script calls
traceml.init()), two CPU ranks over gloo. Each rank's summary is gathered at finish; rank 0
writes one merged summary naming the straggler and its cause from each rank's own work.
Through `traceml-ci run --nproc-per-node`: tests/cli/test_run_distributed.py.

Three jobs: balanced (the group destroyed: the tracer finishes there), the README's loop
(finish first) with a slow forward, shared by two tests, and a job that never destroys its
group."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.distributed_checks import assert_no_confident_straggler
from traceml_ci.summary.schema import summary_problems

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"
#: The example with its slow rank's forward a wait, not a spin: on a loaded machine a spin is
#: mostly waiting for a CPU, which the straggler analysis takes off (tests/cli/ddp_job.py).
WAITING_EXAMPLE = Path(__file__).resolve().parents[1] / "cli" / "ddp_job.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(out: Path, *args: str, timeout: float = 120.0,
             env: dict[str, str] | None = None,
             script: Path = EXAMPLE) -> subprocess.CompletedProcess[str]:
    """Two ranks of the example (or ``script``) under torchrun; the whole process group is
    killed if it outlives ``timeout``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), str(script),
           "--steps", "30", *args]
    full_env = {**os.environ, "TRACEML_CI_OUT": str(out), "TRACEML_CI_LIVE": "0", **(env or {})}
    proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, output, "")


def merged(out: Path) -> dict[str, Any]:
    doc = json.loads((out / "final_summary.json").read_text())
    assert summary_problems(doc) == []
    return doc


def test_balanced_ranks_merge_into_one_summary(tmp_path: Path) -> None:
    done = torchrun(tmp_path)
    assert done.returncode == 0, done.stdout
    doc = merged(tmp_path)
    dist = doc["distributed"]
    assert (dist["world_size"], dist["ranks_reported"], dist["backend"]) == (2, 2, "gloo")
    assert dist["nodes"] == 1
    assert_no_confident_straggler(dist)  # on a loaded machine, at most a marginal one
    assert [r["rank"] for r in dist["ranks"]] == [0, 1]
    assert [r["local_rank"] for r in dist["ranks"]] == [0, 1]
    for r in (0, 1):  # every rank keeps its own summary too
        own = json.loads((tmp_path / f"final_summary.rank{r}.json").read_text())
        assert own["run"]["rank"] == r and "distributed" not in own


@pytest.fixture(scope="module")
def finish_first_slow_forward(tmp_path_factory: pytest.TempPathFactory
                              ) -> tuple[Path, subprocess.CompletedProcess[str], float]:
    """One job for two tests (a torchrun job of two gloo ranks takes seconds): the README's
    loop (``traceml.finish()`` on every rank, then ``destroy_process_group``) with rank 0
    slow in forward, its extra time a wait (``WAITING_EXAMPLE``). The gather's timeout is
    raised, so a stall fails on time, not on a warning. Its folder, the run and its seconds."""
    out = tmp_path_factory.mktemp("finish_first")
    start = time.monotonic()
    done = torchrun(out, "--finish-first", "--slow-rank", "0", "--slow", "forward",
                    "--slow-ms", "12", script=WAITING_EXAMPLE,
                    env={"TRACEML_CI_GATHER_TIMEOUT_S": "100", "OMP_NUM_THREADS": "1"},
                    timeout=240)
    return out, done, time.monotonic() - start


def test_a_rank_slow_in_forward_is_named_a_compute_straggler(finish_first_slow_forward) -> None:
    out, done, _ = finish_first_slow_forward
    assert done.returncode == 0, done.stdout
    dist = merged(out)["distributed"]
    s = dist["straggler"]
    assert (s["label"], s["rank"], s["cause"]) == ("COMPUTE_STRAGGLER", 0, "forward")
    ranks = {r["rank"]: r for r in dist["ranks"]}
    # Rank 1 waited for it, in the wait phase now (no longer inside its backward).
    assert ranks[1]["wait_ms"] > ranks[0]["wait_ms"]


def test_a_script_that_never_destroys_its_group_still_merges(tmp_path: Path) -> None:
    done = torchrun(tmp_path, "--no-destroy", "--slow-rank", "1", "--slow", "data")
    assert done.returncode == 0, done.stdout
    assert merged(tmp_path)["distributed"]["straggler"]["rank"] == 1


def test_finish_before_destroy_gathers_at_once(finish_first_slow_forward) -> None:
    """The output folder's claim was held across the gather, so one rank waited on the other's
    lock while that one waited in the gather: a stall until the gather timed out, and no
    merged summary."""
    out, done, took = finish_first_slow_forward
    assert done.returncode == 0, done.stdout
    assert "failed" not in done.stdout and "warning" not in done.stdout, done.stdout
    dist = merged(out)["distributed"]
    assert (dist["world_size"], dist["ranks_reported"]) == (2, 2)
    assert dist["straggler"]["rank"] == 0  # both ranks' own work reached rank 0's merge
    assert took < 90, f"the finish stalled: {took:.0f} s"


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # (Before the module's shared job too: that one sets it itself. Unset, torchrun warns.)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
