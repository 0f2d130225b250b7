"""`traceml-ci run --nproc-per-node N` (and --nnodes/--node-rank/--rdzv-*): every rank launched
through torchrun and traced; one merged summary names the straggler; a lost rank is named,
the launch exits non-zero and nothing hangs. (Which rank the others wait for is the ranks' own
analysis: its balanced and slow-forward cases read plain torchrun jobs that
tests/tracer/test_distributed.py asserts on too, tests/distributed_jobs.py.)"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests import distributed_jobs
from tests.cli.scripts import kill_group
from tests.distributed_checks import assert_no_confident_straggler
from traceml_ci.summary.schema import summary_problems

EXAMPLE = distributed_jobs.EXAMPLE
#: The example with its slow rank's forward/backward/optimizer time a wait, not a spin: on a
#: loaded machine a spin is mostly waiting for a CPU, which the straggler analysis takes off
#: (tests/cli/ddp_job.py). The input straggler's sleep needs no such change.
WAITING_EXAMPLE = distributed_jobs.WAITING_EXAMPLE
# Twice the example's default: two ranks on two cores, beside the rest of a loaded suite, make
# own-work noise that the straggler guard rightly weighs against a 6 ms excess.
SLOW_MS = ("--slow-ms", "12")
#: The input stragglers': the example's default, slept per sample (8 a batch), is 48 ms more
#: input wait a step, four times the compute stragglers' 12 ms; SLOW_MS would be 96 ms a step,
#: 3 s of sleeping a run.
DATA_SLOW_MS = ("--slow-ms", "6")
CLI = [sys.executable, "-m", "traceml_ci"]
_free_port = distributed_jobs.free_port


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "TRACEML_CI_LIVE": "0", "TRACEML_CI_PROGRESS_INTERVAL": "0",
            "OMP_NUM_THREADS": "1", **extra}


def _start(cwd: Path, *args: str, **env: str) -> Any:
    import subprocess

    return subprocess.Popen([*CLI, "run", *args], cwd=cwd, env=_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _finish(proc: Any, timeout: float = 120) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        kill_group(proc)
    return proc.returncode, out


def _merged(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    assert summary_problems(doc) == []
    return doc


def test_run_nproc_per_node_names_the_input_straggler(tmp_path: Path) -> None:
    code, out = _finish(_start(tmp_path, "--out", "out", "--nproc-per-node", "2",
                               "--master-port", str(_free_port()), str(EXAMPLE), "--steps",
                               "30", "--slow-rank", "1", "--slow", "data", *DATA_SLOW_MS))
    assert code == 0, out
    doc = _merged(tmp_path / "out" / "final_summary.json")
    dist = doc["distributed"]
    assert (dist["world_size"], dist["ranks_reported"], dist["nodes"]) == (2, 2, 1)
    s = dist["straggler"]
    assert (s["label"], s["rank"], s["cause"]) == ("INPUT_STRAGGLER", 1, "dataloader")
    assert doc["run"]["mode"] == "auto" and doc["run"]["name"] == "train_ddp"
    # Where the merged summary is, said once (the ranks finish inside torchrun, silently).
    assert out.count("traceml-ci: summary written to out/final_summary.json") == 1, out


def test_two_nodes_simulated_on_one_machine_merge_into_one_summary(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{_free_port()}"
    procs = [
        _start(tmp_path, "--out", f"node{n}", "--nnodes", "2", "--node-rank", str(n),
               "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
               "--rdzv-id", "sim", str(EXAMPLE), "--steps", "30", "--slow-rank", "1",
               "--slow", "data", *DATA_SLOW_MS)
        for n in (0, 1)
    ]
    results = [_finish(p) for p in procs]
    assert all(code == 0 for code, _ in results), results
    # Rendezvous decides which launcher hosts rank 0: its folder holds the merged summary.
    merged = [p for p in tmp_path.glob("node*/final_summary.json")]
    assert len(merged) == 1
    dist = _merged(merged[0])["distributed"]
    assert (dist["world_size"], dist["nodes"], dist["ranks_reported"]) == (2, 2, 2)
    assert dist["straggler"]["label"] == "INPUT_STRAGGLER" and dist["straggler"]["rank"] == 1
    assert {r["node_rank"] for r in dist["ranks"]} == {0, 1}


def test_a_rank_lost_mid_run_is_named_and_nothing_hangs(tmp_path: Path) -> None:
    started = time.monotonic()
    code, out = _finish(_start(tmp_path, "--out", "out", "--nproc-per-node", "2",
                               "--master-port", str(_free_port()), str(EXAMPLE),
                               "--steps", "30", "--slow-rank", "1", "--die-at", "12",
                               TRACEML_CI_GATHER_TIMEOUT_S="5"), timeout=120)
    assert code != 0, out
    assert time.monotonic() - started < 90
    doc = _merged(tmp_path / "out" / "final_summary.json")
    # Rank 0 ends one of two ways, a race a loaded machine can tip: its collective fails first
    # (crashed), or torchrun's SIGTERM for the surviving ranks comes first (interrupted). Not
    # completed, either way; the lost rank is what names the cause.
    assert doc["run"]["status"] in ("crashed", "interrupted")
    assert doc["distributed"]["failed_ranks"] == [1]
    assert doc["distributed"]["ranks_reported"] == 1
    assert (tmp_path / "out" / "final_summary.rank0.json").is_file()


def test_distributed_options_without_nproc_per_node_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from traceml_ci.cli.main import main

    monkeypatch.chdir(tmp_path)
    # main(argv) in this process, as the console script: refused before anything starts
    code = main(["run", "--nnodes", "2", str(EXAMPLE)])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert (out + err).strip() == "traceml-ci: error: distributed options need --nproc-per-node N"


def _wait_phase_job(cwd: Path, slow: str) -> Path:
    """The example (its slow rank waiting, not spinning) with rank 1 slow in ``slow``, 30
    steps; its output folder."""
    code, out = _finish(_start(cwd, "--out", "out", "--nproc-per-node", "2",
                               "--master-port", str(_free_port()), str(WAITING_EXAMPLE),
                               "--steps", "30", "--slow-rank", "1", "--slow", slow, *SLOW_MS))
    assert code == 0, out
    return cwd / "out"


def _shared_job(job: distributed_jobs.Job) -> Path:
    """A job of tests/distributed_jobs.py (plain torchrun, shared with
    tests/tracer/test_distributed.py): its output folder."""
    assert job.returncode == 0, job.stdout
    return job.out


def test_the_live_snapshots_of_a_ddp_run_show_the_wait_and_label_ranks_as_its_summary(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Each rank's last live snapshot has the wait phase (its shares adding to 100), and the
    live view names the straggler the merged summary names, from those snapshots (the shared
    job with a rank slow in forward, live snapshots on)."""
    from traceml_ci.cli.live_view import plain_progress_line, rank_straggler
    from traceml_ci.summary.keys import PHASES_WITH_WAIT
    from traceml_ci.summary.live import read_snapshots

    out_dir = _shared_job(distributed_jobs.slow_forward(tmp_path_factory))
    slow, other = distributed_jobs.SLOW_FORWARD_RANK, 1 - distributed_jobs.SLOW_FORWARD_RANK
    snaps = read_snapshots(out_dir)
    assert [s["rank"] for s in snaps] == [0, 1]
    for snap in snaps:
        pct = snap["window"]["pct"]
        assert snap["status"] == "completed" and list(pct) == list(PHASES_WITH_WAIT)
        assert abs(sum(pct.values()) - 100.0) < 0.1
    assert snaps[other]["window"]["phase_ms"]["wait"] > snaps[slow]["window"]["phase_ms"]["wait"]
    s = _merged(out_dir / "final_summary.json")["distributed"]["straggler"]
    assert rank_straggler(snaps) == (s["label"], s["rank"]) == ("COMPUTE_STRAGGLER", slow)
    assert "wait" in plain_progress_line(snaps) and f"COMPUTE_STRAGGLER rank {slow}" in \
        plain_progress_line(snaps)


@pytest.mark.parametrize(
    ("slow", "label"),
    [
        ("forward", "COMPUTE_STRAGGLER"),
        ("backward", "COMPUTE_STRAGGLER"),
        ("optimizer", "STRAGGLER"),
        (None, "RANKS_BALANCED"),
    ],
)
def test_the_rank_the_others_wait_for_is_named_with_its_phase(
    tmp_path: Path, slow: str | None, label: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """One run per case (3/3 each measured, also beside two CPU hogs: docs/distributed.md).
    The slow rank takes 12 ms more per step in one phase; the other waits for it in its wait
    phase, and the merged summary's split is the slow rank's. (forward and balanced: the jobs
    of tests/distributed_jobs.py, forward's slow rank rank 0, shared with the live test above
    and tests/tracer/test_distributed.py.)"""
    slow_rank = 1
    if slow == "forward":
        out_dir = _shared_job(distributed_jobs.slow_forward(tmp_path_factory))
        slow_rank = distributed_jobs.SLOW_FORWARD_RANK
    elif slow is None:
        out_dir = _shared_job(distributed_jobs.balanced(tmp_path_factory))
    else:
        out_dir = _wait_phase_job(tmp_path, slow)
    other = 1 - slow_rank
    doc = _merged(out_dir / "final_summary.json")
    dist = doc["distributed"]
    s = dist["straggler"]
    ranks = {r["rank"]: r for r in dist["ranks"]}
    assert all(r["wait_ms"] is not None and "wait" in r["pct"] for r in ranks.values())
    assert s["evidence"] == "wait", s
    if slow is None:  # balanced (on a loaded machine, at most a marginal straggler)
        assert_no_confident_straggler(dist)
        return
    assert s["label"] == label, s
    assert (s["rank"], s["cause"]) == (slow_rank, slow)
    # the other rank waits for the slow one
    assert ranks[other]["wait_ms"] > ranks[slow_rank]["wait_ms"] + 2.0
    # The headline is the slow rank's own split, with its own diagnosis.
    assert dist["headline_rank"] == slow_rank
    assert doc["step_time"]["phase_ms"] == ranks[slow_rank]["phase_ms"]
    per_rank = json.loads((out_dir / f"final_summary.rank{slow_rank}.json").read_text())
    assert doc["step_time"]["diagnosis"] == per_rank["step_time"]["diagnosis"]
