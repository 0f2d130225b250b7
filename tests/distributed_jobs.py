"""Two-rank gloo jobs under plain torchrun (examples/train_ddp.py, which calls ``traceml.init()``),
and the two that tests in more than one file assert different things on, each run once per test
session: a torchrun job is an agent and two ranks, each a fresh interpreter importing torch.

Used by tests/tracer/test_distributed.py and tests/cli/test_run_distributed.py (whose cases
about which rank the others wait for take the balanced and the slow-forward job from here: the
straggler analysis they check is the ranks' own, whichever launcher started them).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.pytest_plugin.shared import once_per_session
from traceml_ci.summary.schema import summary_problems

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_ddp.py"
#: The example with its slow rank's forward/backward/optimizer time a wait, not a spin: on a
#: loaded machine a spin is mostly waiting for a CPU, which the straggler analysis takes off
#: (tests/cli/ddp_job.py).
WAITING_EXAMPLE = REPO / "tests" / "cli" / "ddp_job.py"
#: The slow-forward job's slow rank: rank 0, the rank that merges, named the straggler by its
#: own merge.
SLOW_FORWARD_RANK = 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(out: Path, *args: str, timeout: float = 120.0,
             env: dict[str, str] | None = None,
             script: Path = EXAMPLE) -> subprocess.CompletedProcess[str]:
    """Two ranks of the example (or ``script``) under torchrun, 30 steps; the whole process
    group is killed if it outlives ``timeout`` (or the wait is interrupted)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script),
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
    """``out``'s merged summary, valid by its schema."""
    doc = json.loads((out / "final_summary.json").read_text())
    assert summary_problems(doc) == []
    return doc


@dataclass(frozen=True)
class Job:
    """A finished shared job: its output folder, exit code, output and wall seconds."""

    out: Path
    returncode: int
    stdout: str
    seconds: float


_JOBS: dict[str, Job] = {}


def _shared(tmp_path_factory: pytest.TempPathFactory, name: str,
            run: Callable[[Path], subprocess.CompletedProcess[str]]) -> Job:
    """``run(folder)`` once per test session, whichever test (file, xdist worker) asks first."""
    if name not in _JOBS:

        def produce() -> dict[str, Any]:
            out = tmp_path_factory.mktemp(name)
            start = time.monotonic()
            done = run(out)
            return {"out": str(out), "returncode": done.returncode, "stdout": done.stdout,
                    "seconds": time.monotonic() - start}

        data = once_per_session(tmp_path_factory, f"distributed_jobs_{name}", produce)
        _JOBS[name] = Job(Path(data["out"]), data["returncode"], data["stdout"], data["seconds"])
    return _JOBS[name]


def balanced(tmp_path_factory: pytest.TempPathFactory) -> Job:
    """The example's ranks doing the same work, 30 steps; the group destroyed at the end (the
    tracer finishes there)."""
    return _shared(tmp_path_factory, "balanced",
                   lambda out: torchrun(out, env={"OMP_NUM_THREADS": "1"}))


def slow_forward(tmp_path_factory: pytest.TempPathFactory) -> Job:
    """The README's loop (``traceml.finish()`` on every rank, then ``destroy_process_group``)
    with rank ``SLOW_FORWARD_RANK`` 12 ms slow in forward, its extra time a wait
    (``WAITING_EXAMPLE``), live snapshots on (they change nothing the summary says). The
    gather's timeout is raised, so a stall fails on time, not on a warning."""
    return _shared(tmp_path_factory, "slow_forward", lambda out: torchrun(
        out, "--finish-first", "--slow-rank", str(SLOW_FORWARD_RANK), "--slow", "forward",
        "--slow-ms", "12", script=WAITING_EXAMPLE, timeout=240,
        env={"TRACEML_CI_GATHER_TIMEOUT_S": "100", "OMP_NUM_THREADS": "1",
             "TRACEML_CI_LIVE": "1"}))
